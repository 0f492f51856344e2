#!/bin/sh
# all_to_all between ranks of one host, in one go: c10d-bench -o all_to_all
# (even splits, blocking, out of place) on the shared-memory path (the
# default: the caller's lane where the op fits one chunk), with the lane off
# (C10D_SHM_LANE=0: the loop runs it) and with the group on tcp alone
# (C10D_SHM=0), against Open MPI's MPI_Alltoall over shared memory (btl
# vader).
#   bench/a2a_compare.sh [BUILD_DIR] [RANKS...]        (default: build 2 4)
# Size: each rank's whole send buffer, split evenly. Prints time per op (us)
# side by side, with c10d's ratio to vader; each peer bound to cores where
# the ranks fit the CPUs, unbound otherwise (where mpirun would not bind).
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
ranks=${*:-2 4}
scripts/install-deps.sh bench
run=$build/tools/c10drun/c10drun
bench=$build/bench/c10d-bench
for f in "$run" "$bench"; do
    [ -x "$f" ] || { echo "a2a_compare: $f not built (cmake --build $build)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
mpicc -O2 -o "$tmp/mpi_alltoall" bench/peer/mpi_alltoall.c
min=64
max=$((1024 * 1024))
c10d_sweep() { # ranks bind env... -> "size time" lines
    n=$1
    bind=$2
    shift 2
    size=$min
    while [ "$size" -le "$max" ]; do
        it=$((64 * 1024 * 1024 / size / 4))
        [ $it -lt 20 ] && it=20
        [ $it -gt 2000 ] && it=2000
        env "$@" "$run" -n "$n" --bind-to "$bind" --no-prefix "$bench" -o all_to_all -b "$size" \
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
    echo "== $n ranks, --bind-to $bind: c10d, the loop (C10D_SHM_LANE=0) =="
    c10d_sweep "$n" "$bind" C10D_SHM_LANE=0 | tee "$tmp/loop.$n"
    echo "== $n ranks, --bind-to $bind: c10d, tcp only (C10D_SHM=0) =="
    c10d_sweep "$n" "$bind" C10D_SHM=0 | tee "$tmp/tcp.$n"
    echo "== $n ranks, --bind-to $bind: Open MPI, btl vader =="
    mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca pml ob1 \
        --mca btl vader,self "$tmp/mpi_alltoall" $min $max 4 | tee "$tmp/vader.$n"
done
/usr/bin/python3 - "$tmp" $ranks <<'PY'
import sys
tmp, ranks = sys.argv[1], sys.argv[2:]
def load(name):
    rows = {}
    for line in open("%s/%s" % (tmp, name)):
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            rows[int(f[0])] = float(f[1])
    return rows
cols = [("lane", "c10d shm"), ("loop", "c10d loop"), ("tcp", "c10d tcp"), ("vader", "mpi vader")]
for n in ranks:
    rows = {k: load("%s.%s" % (k, n)) for k, _ in cols}
    print("\nall_to_all, %s ranks, time per op (us); last column: c10d shm / vader" % n)
    print("%10s | " % "size" + " ".join("%10s" % name for _, name in cols) + " | shm/vader")
    for size in sorted(rows["lane"]):
        t = [rows[k].get(size, 0.0) for k, _ in cols]
        r = "%.2fx" % (t[0] / t[3]) if t[0] and t[3] else "n/a"
        print("%10d | " % size + " ".join("%10.1f" % v for v in t) + " | %s" % r)
PY
