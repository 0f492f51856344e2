#!/bin/sh
# Peer comparison in one go, on this machine: c10d-bench (tcp backend, with
# its shared-memory all_reduce and with C10D_SHM=0), torch.distributed gloo,
# Open MPI over TCP and over shared memory (btl vader) and iperf3 (the
# loopback limit), all_reduce float32 SUM from 4 B to 64 MiB, 2 and 4 ranks.
#   bench/peer_compare.sh [BUILD_DIR] [RANKS...]       (default: build 2 4)
# Prints time (us) and busbw (GB/s) side by side with ratios.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
[ $# -gt 0 ] && shift
ranks=${*:-2 4}
min=4
max=$((64 * 1024 * 1024))
factor=4
scripts/install-deps.sh bench
run=$build/tools/c10drun/c10drun
bench=$build/bench/c10d-bench
for f in "$run" "$bench"; do
    [ -x "$f" ] || { echo "peer_compare: $f not built (cmake --build $build)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'kill $(cat "$tmp"/*.pid 2>/dev/null) 2>/dev/null || true; rm -rf "$tmp"' EXIT INT TERM

mpicc -O2 -o "$tmp/mpi_allreduce" bench/peer/mpi_allreduce.c

# iperf3 on loopback: one stream, 3 s.
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
echo $! >"$tmp/iperf.pid"
sleep 0.5
iperf3 -c 127.0.0.1 -p "$port" -t 3 -J >"$tmp/iperf.json" 2>/dev/null || true
loop_gbps=$(/usr/bin/python3 -c "import json,sys
try: print('%.2f' % (json.load(open('$tmp/iperf.json'))['end']['sum_received']['bits_per_second']/8e9))
except Exception: print('n/a')")

# The same conditions for all three: blocking calls (one op completes before the
# next starts, as MPI_Allreduce and dist.all_reduce do), the same number of
# iterations per size, and the loop timed as a whole (c10d-bench -p 0: no clock
# read per op, which costs 25 ns here, as the MPI and gloo benches time theirs),
# and in place (c10d-bench -i 1: one buffer, as MPI_IN_PLACE in mpi_allreduce.c
# and torch's dist.all_reduce(t); out of place a rank also copies its input to
# its output, about 0.1 ms more at 4 MiB).
# Placement: mpirun binds each rank to a core by default
# when they fit (2 ranks here) and not when oversubscribed; binding helps some
# peers and hurts others (gloo's threads then share one core), so when the ranks
# fit, every peer runs both bound and unbound and keeps its better time per size.
cpus=$(nproc)
iterations() { # bytes -> iterations, the rule of gloo_allreduce.py and mpi_allreduce.c
    i=$((64 * 1024 * 1024 / $1 / 4))
    [ $i -lt 20 ] && i=20
    [ $i -gt 1000 ] && i=1000
    echo $i
}
c10d_sweep() { # ranks bind shm -> "size time busbw" lines
    size=$min
    while [ "$size" -le "$max" ]; do
        it=$(iterations "$size")
        w=$((it / 10)); [ $w -lt 2 ] && w=2
        C10D_SHM=$3 "$run" -n "$1" --bind-to "$2" --no-prefix "$bench" -o all_reduce -d float32 -r sum \
            -b "$size" -e "$size" -n "$it" -w "$w" -z 1 -p 0 -c 0 -i 1 \
            | awk '$1 ~ /^[0-9]+$/ && NF >= 9 {print $1, $6, $8; fflush()}'
        size=$((size * factor))
    done
}
for n in $ranks; do
    binds=none
    [ "$n" -le "$cpus" ] && binds="core none"
    for bind in $binds; do
        echo "== $n ranks, --bind-to $bind: c10d-bench (shared memory) =="
        c10d_sweep "$n" "$bind" 1 | tee "$tmp/c10d.$n.$bind"
        echo "== $n ranks, --bind-to $bind: c10d-bench (tcp, C10D_SHM=0) =="
        c10d_sweep "$n" "$bind" 0 | tee "$tmp/c10dtcp.$n.$bind"
        echo "== $n ranks, --bind-to $bind: torch gloo =="
        "$run" -n "$n" --bind-to "$bind" --no-prefix /usr/bin/python3 bench/peer/gloo_allreduce.py \
            --min $min --max $max --factor $factor | tee "$tmp/gloo.$n.$bind"
        echo "== $n ranks, --bind-to $bind: Open MPI (btl tcp,self) =="
        mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca pml ob1 \
            --mca btl tcp,self --mca btl_tcp_if_include lo "$tmp/mpi_allreduce" $min $max $factor \
            | tee "$tmp/mpi.$n.$bind"
        echo "== $n ranks, --bind-to $bind: Open MPI (btl vader,self: shared memory) =="
        mpirun --allow-run-as-root --oversubscribe --bind-to "$bind" -np "$n" --mca pml ob1 \
            --mca btl vader,self "$tmp/mpi_allreduce" $min $max $factor \
            | tee "$tmp/vader.$n.$bind"
    done
done

/usr/bin/python3 - "$tmp" "$loop_gbps" $ranks <<'PY'
import sys
tmp, loop, ranks = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 3 and f[0].isdigit():
            rows[int(f[0])] = (float(f[1]), float(f[2]))
    return rows
def best(kind, n):
    """Per size, the faster of the bound and unbound runs (those that exist)."""
    rows = {}
    for bind in ("core", "none"):
        try:
            got = load("%s/%s.%s.%s" % (tmp, kind, n, bind))
        except OSError:
            continue
        for size, (t, bw) in got.items():
            if size not in rows or t < rows[size][0]:
                rows[size] = (t, bw)
    return rows
def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "n/a"
print("\nloopback limit (iperf3, 1 stream): %s GB/s" % loop)
kinds = [("c10d", "c10d shm"), ("c10dtcp", "c10d tcp"), ("gloo", "gloo"), ("mpi", "mpi tcp"),
         ("vader", "mpi vader")]
for n in ranks:
    rows = {k: best(k, n) for k, _ in kinds}
    c = rows["c10d"]
    print("\nall_reduce float32 sum, %s ranks, each peer's best of bound and unbound; time (us) "
          "per peer, then c10d shm's time ratio to each (< 1 favours c10d shm), then busbw (GB/s)"
          % n)
    print("%10s | " % "size" + " ".join("%10s" % name for _, name in kinds) + " | " +
          " ".join("%9s" % ("/" + k) for k, _ in kinds[1:]) + " | " + " ".join("%9s" % ("bw " + k) for k, _ in kinds))
    for size in sorted(set().union(*[set(r) for r in rows.values()])):
        t = {k: rows[k].get(size, (0, 0)) for k, _ in kinds}
        print("%10d | " % size + " ".join("%10.1f" % t[k][0] for k, _ in kinds) + " | " +
              " ".join("%9s" % ratio(c.get(size, (0, 0))[0], t[k][0]) for k, _ in kinds[1:]) +
              " | " + " ".join("%9.3f" % t[k][1] for k, _ in kinds))
PY
