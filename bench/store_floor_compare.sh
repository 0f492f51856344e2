#!/usr/bin/env bash
# Server CPU per op of c10d-store (and PyTorch's TCPStore server) against
# the physical floor on this kernel (bench/store_floor.c: a bare epoll loop
# with fixed answers), for store_loadgen's get and add patterns.
#
#   bench/store_floor_compare.sh BUILD_DIR [--pin split|shared] [--rounds N]
#          [--duration S] [--conns K] [--patterns "get add"] [--dialect legacy|current]
#          [--base PATH] [--no-torch] [--raw FILE]
#
# Each server is started once and stays up; every round runs each pattern
# against each server in turn (floor, ours, base, torch, floor, ...), so a
# neighbour's burst hits all of them alike. CPU per op is the server's
# utime+stime (/proc/PID/stat) over the load generator's window divided by
# the ops completed in it. Per round the ratio to that round's floor is
# printed; the summary shows each server's median ratio and its spread.
#   --pin split    server on CPU 0, load generator on CPU 1 (default)
#   --pin shared   both on CPU 0 (more requests per wake-up, no idle CPU)
#   --base PATH    another c10d-store binary as an extra column (A/B)
#   --no-torch     skip /usr/bin/python3's torch.distributed.TCPStore
set -u

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

[ $# -ge 1 ] || usage
case $1 in -h | --help) usage ;; esac
BUILD=$1
shift
PIN=split
ROUNDS=5
DURATION=2
CONNS=256
PATTERNS="get add"
DIALECT=legacy
BASE=""
TORCH=1
RAW=""
while [ $# -gt 0 ]; do
    case $1 in
    --pin) PIN=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --patterns) PATTERNS=$2; shift 2 ;;
    --dialect) DIALECT=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --no-torch) TORCH=0; shift ;;
    --raw) RAW=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "store_floor_compare.sh: unknown argument '$1'" >&2; usage ;;
    esac
done
case $PIN in
split) SRV_CPU=0; GEN_CPU=1 ;;
shared) SRV_CPU=0; GEN_CPU=0 ;;
*) echo "store_floor_compare.sh: --pin split or shared" >&2; exit 2 ;;
esac

STORE=$BUILD/store_server/c10d-store
LOADGEN=$BUILD/bench/store_loadgen
FLOOR=$BUILD/bench/store_floor
for f in "$STORE" "$LOADGEN" "$FLOOR" ${BASE:+"$BASE"}; do
    if [ ! -x "$f" ]; then
        echo "store_floor_compare.sh: $f is missing (cmake --build $BUILD --target c10d-store store_loadgen store_floor)" >&2
        exit 2
    fi
done
PY=/usr/bin/python3
if [ "$TORCH" = 1 ] && ! $PY -c 'import torch.distributed' 2>/dev/null; then
    echo "store_floor_compare.sh: /usr/bin/python3 cannot import torch.distributed: no torch column" >&2
    TORCH=0
fi
if [ "$TORCH" = 1 ] && [ "$DIALECT" = current ] &&
    ! $PY -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)'; then
    echo "store_floor_compare.sh: this torch speaks only the legacy dialect: no torch column" >&2
    TORCH=0
fi

TMP=$(mktemp -d /tmp/store_floor.XXXXXX)
declare -A PID PORT
SERVERS=()
cleanup() {
    for s in "${SERVERS[@]}"; do
        kill "${PID[$s]}" 2>/dev/null
    done
    for s in "${SERVERS[@]}"; do
        wait "${PID[$s]}" 2>/dev/null
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME COMMAND...: COMMAND must write its port to $TMP/NAME.port.
start() {
    local name=$1
    shift
    taskset -c "$SRV_CPU" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    PID[$name]=$!
    SERVERS+=("$name")
    for _ in $(seq 300); do
        [ -s "$TMP/$name.port" ] && break
        if ! kill -0 "${PID[$name]}" 2>/dev/null; then
            echo "store_floor_compare.sh: $name exited at start:" >&2
            cat "$TMP/$name.err" >&2
            exit 1
        fi
        sleep 0.1
    done
    PORT[$name]=$(cat "$TMP/$name.port")
}

start floor "$FLOOR" --port-file "$TMP/floor.port"
start ours "$STORE" serve --host 127.0.0.1 --port 0 --port-file "$TMP/ours.port" --stats-interval-s 0
[ -n "$BASE" ] && start base "$BASE" serve --host 127.0.0.1 --port 0 --port-file "$TMP/base.port" \
    --stats-interval-s 0
if [ "$TORCH" = 1 ]; then
    start torch $PY -c '
import datetime, os, sys, time
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], 0, 1, True, datetime.timedelta(seconds=300), wait_for_workers=False)
open(sys.argv[2] + ".tmp", "w").write("%d\n" % s.port)
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    time.sleep(3600)
' 127.0.0.1 "$TMP/torch.port"
fi

RESULTS=$TMP/results
: >"$RESULTS"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg);" \
    "pin=$PIN conns=$CONNS dialect=$DIALECT duration=${DURATION}s rounds=$ROUNDS;" \
    "servers: ${SERVERS[*]}" >&2
for r in $(seq "$ROUNDS"); do
    for p in $PATTERNS; do
        for s in "${SERVERS[@]}"; do
            line=$(taskset -c "$GEN_CPU" "$LOADGEN" --port "${PORT[$s]}" --server-pid "${PID[$s]}" \
                --label "$s" --dialect "$DIALECT" --mode ops --pattern "$p" --conns "$CONNS" \
                --duration "$DURATION" --warmup 0.3 --timeout 60 2>"$TMP/loadgen.err" |
                grep '^RESULT')
            [ -n "$line" ] || line="RESULT label=$s status=loadgen-failed"
            kill -0 "${PID[$s]}" 2>/dev/null || line="$line server_died=1"
            echo "round=$r duration=$DURATION $line" >>"$RESULTS"
            echo "round=$r $line" >&2
        done
    done
done
[ -n "$RAW" ] && cp "$RESULTS" "$RAW"

$PY - "$RESULTS" "$PATTERNS" "${SERVERS[*]}" <<'EOF'
import statistics, sys

rows = {}  # (pattern, round) -> server -> (us/op, ops/s)
for line in open(sys.argv[1]):
    kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
    if kv.get("status") != "ok" or "server_cpu" not in kv or int(kv.get("ops", 0)) == 0:
        print("failed run:", line.strip())
        continue
    us = float(kv["server_cpu"]) * float(kv["duration"]) / int(kv["ops"]) * 1e6
    rows.setdefault((kv["pattern"], int(kv["round"])), {})[kv["label"]] = (us, float(kv["ops_s"]))
servers = sys.argv[3].split()
others = [s for s in servers if s != "floor"]
for p in sys.argv[2].split():
    print(f"\n{p}: server CPU per op in us (ops/s in thousands), ratio to the same round's floor")
    print("round " + "".join(f"{s:>22}" for s in servers))
    ratios = {s: [] for s in others}
    cpu = {s: [] for s in servers}
    for (pat, r), d in sorted(rows.items()):
        if pat != p:
            continue
        cells = []
        for s in servers:
            if s not in d:
                cells.append(f"{'-':>22}")
                continue
            us, ops = d[s]
            cpu[s].append(us)
            if s != "floor" and "floor" in d:
                ratios[s].append(us / d["floor"][0])
                cells.append(f"{us:8.2f} ({ops / 1e3:5.0f}) {us / d['floor'][0]:5.2f}x")
            else:
                cells.append(f"{us:8.2f} ({ops / 1e3:5.0f})       ")
        print(f"{r:5d} " + "".join(cells))
    for s in servers:
        if not cpu[s]:
            continue
        line = f"  {s:6} us/op median {statistics.median(cpu[s]):6.2f} [{min(cpu[s]):.2f}..{max(cpu[s]):.2f}]"
        if s in ratios and ratios[s]:
            q = ratios[s]
            line += f"   ratio median {statistics.median(q):.3f}x [{min(q):.3f}..{max(q):.3f}]"
        print(line)
EOF
