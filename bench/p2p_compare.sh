#!/bin/sh
# P2P between ranks of one host, in one go: c10d-bench -o sendrecv (every
# rank sends to the next and receives from the previous, blocking) on the
# shared-memory path (the default: mailboxes in the caller's lane for
# single small ops, the segment's rings otherwise), on the rings alone
# (C10D_SHM_LANE=0), through the sockets (C10D_SHM_P2P=0), and with the
# group on tcp alone (C10D_SHM=0), against Open MPI's MPI_Sendrecv over
# shared memory (btl vader) and over tcp.
#   bench/p2p_compare.sh [BUILD_DIR] [RANKS]         (default: build 2)
# OP=pingpong: ranks 2k and 2k+1 trade single blocking sends and receives
# instead (c10d-bench -o pingpong, MPI_Send/MPI_Recv; a round trip per op).
# Prints time per exchange (us) side by side, with c10d's ratio to vader.
# c10d's loop is timed as a whole (-p 0), as the MPI bench times its own.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-2}
op=${OP:-sendrecv}
scripts/install-deps.sh bench
run=$build/tools/c10drun/c10drun
bench=$build/bench/c10d-bench
for f in "$run" "$bench"; do
    [ -x "$f" ] || { echo "p2p_compare: $f not built (cmake --build $build)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
mpicc -O2 -o "$tmp/mpi_sendrecv" bench/peer/mpi_sendrecv.c
bind=none
[ "$n" -le "$(nproc)" ] && bind=core
min=4
max=$((16 * 1024 * 1024))
c10d_sweep() { # env... -> "size time" lines
    size=$min
    while [ "$size" -le "$max" ]; do
        it=$((64 * 1024 * 1024 / size / 4))
        [ $it -lt 5 ] && it=5
        [ $it -gt 2000 ] && it=2000
        env "$@" "$run" -n "$n" --bind-to "$bind" --no-prefix "$bench" -o "$op" -b "$size" \
            -e "$size" -n "$it" -w $((it / 10 + 2)) -z 1 -p 0 -c 0 |
            awk '$1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $6; fflush()}'
        size=$((size * 16))
    done
}
echo "== c10d, shared memory (default) =="
c10d_sweep C10D_SHM_P2P=1 | tee "$tmp/shm"
echo "== c10d, rings alone (C10D_SHM_LANE=0) =="
c10d_sweep C10D_SHM_LANE=0 | tee "$tmp/rings"
echo "== c10d, sockets (C10D_SHM_P2P=0) =="
c10d_sweep C10D_SHM_P2P=0 | tee "$tmp/sockets"
echo "== c10d, tcp only (C10D_SHM=0) =="
c10d_sweep C10D_SHM=0 | tee "$tmp/tcp"
for btl in vader tcp; do
    echo "== Open MPI, btl $btl =="
    mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca pml ob1 \
        --mca btl "$btl,self" "$tmp/mpi_sendrecv" $min $max 16 "$op" | tee "$tmp/mpi_$btl"
done
/usr/bin/python3 - "$tmp" "$n" "$op" <<'PY'
import sys
tmp, n, op = sys.argv[1], sys.argv[2], sys.argv[3]
def load(name):
    rows = {}
    for line in open("%s/%s" % (tmp, name)):
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            rows[int(f[0])] = float(f[1])
    return rows
cols = [("shm", "c10d shm"), ("rings", "c10d rings"), ("sockets", "c10d socket"),
        ("tcp", "c10d tcp"), ("mpi_vader", "mpi vader"), ("mpi_tcp", "mpi tcp")]
rows = {k: load(k) for k, _ in cols}
print("\n%s, %s ranks, time per exchange (us); last column: c10d shm / vader" % (op, n))
print("%10s | " % "size" + " ".join("%12s" % name for _, name in cols) + " | shm/vader")
for size in sorted(rows["shm"]):
    t = [rows[k].get(size, 0.0) for k, _ in cols]
    r = "%.2fx" % (t[0] / t[4]) if t[0] and t[4] else "n/a"
    print("%10d | " % size + " ".join("%12.1f" % v for v in t) + " | %s" % r)
PY
