#!/bin/sh
# The collectives that move data without reducing it, between ranks of one
# host, in one go: c10d-bench -o OP (all_to_all with even splits, broadcast
# from rank 0, all_gather, gather to and scatter from rank 0; blocking) on the shared-memory path (the default:
# the caller's lane where the op fits one chunk, a large broadcast or
# all_gather read in place), through the slots only (C10D_SHM_IN_PLACE=0),
# with the lane off (C10D_SHM_LANE=0: the loop runs it) and with the group
# on tcp alone (C10D_SHM=0), against Open MPI over shared memory (btl vader,
# bench/peer/mpi_move.c).
#   OP=all_to_all|broadcast|all_gather|gather|scatter bench/move_compare.sh [BUILD_DIR] [RANKS...]
#   (default: all_to_all, build, 2 4)
# Size: as c10d-bench's -b (an all_to_all's send buffer, a broadcast's
# buffer, an all_gather's or gather's output, a scatter's input). Prints time per op (us) side by side,
# with c10d's ratio to vader; each peer bound to cores where the ranks fit
# the CPUs, unbound otherwise (where mpirun would not bind).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
ranks=${*:-2 4}
op=${OP:-all_to_all}
scripts/install-deps.sh bench
run=$build/tools/c10drun/c10drun
bench=$build/bench/c10d-bench
for f in "$run" "$bench"; do
    [ -x "$f" ] || { echo "move_compare: $f not built (cmake --build $build)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
mpicc -O2 -o "$tmp/mpi_move" bench/peer/mpi_move.c
min=64
max=$((4 * 1024 * 1024))
c10d_sweep() { # ranks bind env... -> "size time" lines
    n=$1
    bind=$2
    shift 2
    size=$min
    while [ "$size" -le "$max" ]; do
        it=$((64 * 1024 * 1024 / size / 4))
        [ $it -lt 20 ] && it=20
        [ $it -gt 2000 ] && it=2000
        env "$@" "$run" -n "$n" --bind-to "$bind" --no-prefix "$bench" -o "$op" -b "$size" \
            -e "$size" -n "$it" -w $((it / 10 + 2)) -z 1 -p 0 -c 0 |
            awk '$1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $6; fflush()}'
        size=$((size * 4))
    done
}
for n in $ranks; do
    bind=none
    [ "$n" -le "$(nproc)" ] && bind=core
    echo "== $n ranks, --bind-to $bind: c10d, shared memory (default) =="
    c10d_sweep "$n" "$bind" C10D_SHM=1 | tee "$tmp/lane.$n"
    echo "== $n ranks, --bind-to $bind: c10d, through the slots (C10D_SHM_IN_PLACE=0) =="
    c10d_sweep "$n" "$bind" C10D_SHM_IN_PLACE=0 | tee "$tmp/slots.$n"
    echo "== $n ranks, --bind-to $bind: c10d, the loop (C10D_SHM_LANE=0) =="
    c10d_sweep "$n" "$bind" C10D_SHM_LANE=0 | tee "$tmp/loop.$n"
    echo "== $n ranks, --bind-to $bind: c10d, tcp only (C10D_SHM=0) =="
    c10d_sweep "$n" "$bind" C10D_SHM=0 | tee "$tmp/tcp.$n"
    echo "== $n ranks, --bind-to $bind: Open MPI, btl vader =="
    mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca pml ob1 \
        --mca btl vader,self "$tmp/mpi_move" "$op" $min $max 4 | tee "$tmp/vader.$n"
done
/usr/bin/python3 - "$tmp" "$op" $ranks <<'PY'
import sys
tmp, op, ranks = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(name):
    rows = {}
    for line in open("%s/%s" % (tmp, name)):
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            rows[int(f[0])] = float(f[1])
    return rows
cols = [("lane", "c10d shm"), ("slots", "c10d slots"), ("loop", "c10d loop"), ("tcp", "c10d tcp"),
        ("vader", "mpi vader")]
for n in ranks:
    rows = {k: load("%s.%s" % (k, n)) for k, _ in cols}
    print("\n%s, %s ranks, time per op (us); last column: c10d shm / vader" % (op, n))
    print("%10s | " % "size" + " ".join("%10s" % name for _, name in cols) + " | shm/vader")
    for size in sorted(rows["lane"]):
        t = [rows[k].get(size, 0.0) for k, _ in cols]
        r = "%.2fx" % (t[0] / t[4]) if t[0] and t[4] else "n/a"
        print("%10d | " % size + " ".join("%10.1f" % v for v in t) + " | %s" % r)
PY
