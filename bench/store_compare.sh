#!/usr/bin/env bash
# Runs, in one go and with the same load generator, c10d-store and PyTorch
# 1.13's TCPStore server (Debian python3-torch, /usr/bin/python3), and prints
# ops/s, p50/p99 latency and ratios per connection count and pattern, the
# rendezvous times of 1k and 10k simulated ranks, and server memory per idle
# connection. Builds nothing.
#
#   bench/store_compare.sh BUILD_DIR [--duration S] [--repeat R] [--conns "1 16 256 4096"]
#                          [--patterns "set get add wait setwait"] [--ranks "1000 10000"]
#                          [--idle N] [--legacy-rdzv-timeout S] [--raw FILE]
#
# Every run gets a fresh server (a crashed or wedged server cannot spoil the
# next row); every server this script starts is killed on exit, also on ^C.
# Each ops row runs R times, the servers interleaved, and shows the best run:
# on a shared machine a neighbour's burst only ever makes a run slower.
set -u

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

[ $# -ge 1 ] || usage
case $1 in -h | --help) usage ;; esac
BUILD=$1
shift
DURATION=3
REPEAT=3
CONNS="1 16 256 4096"
PATTERNS="set get add wait setwait"
RANKS="1000 10000"
IDLE=10000
LEGACY_RDZV_TIMEOUT=60
RAW=""
while [ $# -gt 0 ]; do
    case $1 in
    --duration) DURATION=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --patterns) PATTERNS=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --idle) IDLE=$2; shift 2 ;;
    --legacy-rdzv-timeout) LEGACY_RDZV_TIMEOUT=$2; shift 2 ;;
    --raw) RAW=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "store_compare.sh: unknown argument '$1'" >&2; usage ;;
    esac
done

STORE=$BUILD/store_server/c10d-store
LOADGEN=$BUILD/bench/store_loadgen
for f in "$STORE" "$LOADGEN"; do
    if [ ! -x "$f" ]; then
        echo "store_compare.sh: $f is missing: build it first (cmake --build $BUILD --target c10d-store store_loadgen)" >&2
        exit 2
    fi
done
PY=/usr/bin/python3
HAVE_TORCH=1
if ! $PY -c 'import torch.distributed' 2>/dev/null; then
    echo "store_compare.sh: /usr/bin/python3 cannot import torch.distributed (apt-get install python3-torch): PyTorch columns are left empty" >&2
    HAVE_TORCH=0
fi

TMP=$(mktemp -d /tmp/store_compare.XXXXXX)
SERVER_PID=""
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null
        # A server that ignores SIGTERM for 5 s gets SIGKILL.
        for _ in $(seq 50); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
        SERVER_PID=""
    fi
}
cleanup() {
    stop_server
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RESULTS=$TMP/results
: >"$RESULTS"

# start_server ours|torch: sets SERVER_PID and PORT, or returns 1.
start_server() {
    rm -f "$TMP/port"
    if [ "$1" = ours ]; then
        "$STORE" serve --host 127.0.0.1 --port 0 --port-file "$TMP/port" \
            --stats-interval-s 0 >"$TMP/server.out" 2>"$TMP/server.err" &
    else
        $PY -c '
import datetime, os, sys, time
import torch.distributed as dist
s = dist.TCPStore(sys.argv[1], 0, 1, True, datetime.timedelta(seconds=300), wait_for_workers=False)
open(sys.argv[2] + ".tmp", "w").write("%d\n" % s.port)
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    time.sleep(3600)
' 127.0.0.1 "$TMP/port" >"$TMP/server.out" 2>"$TMP/server.err" &
    fi
    SERVER_PID=$!
    for _ in $(seq 300); do
        [ -s "$TMP/port" ] && break
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            echo "store_compare.sh: the $1 server exited at start:" >&2
            cat "$TMP/server.err" >&2
            SERVER_PID=""
            return 1
        fi
        sleep 0.1
    done
    if [ ! -s "$TMP/port" ]; then
        echo "store_compare.sh: the $1 server did not start within 30 s" >&2
        stop_server
        return 1
    fi
    PORT=$(cat "$TMP/port")
}

# run SERVER LABEL LOADGEN-ARGS...: one fresh server, one generator run.
run() {
    local server=$1 label=$2
    shift 2
    if [ "$server" = torch ] && [ "$HAVE_TORCH" = 0 ]; then
        return
    fi
    start_server "$server" || {
        echo "RESULT label=$label status=server-failed" >>"$RESULTS"
        return
    }
    local line
    line=$("$LOADGEN" --port "$PORT" --server-pid "$SERVER_PID" --label "$label" "$@" \
        2>"$TMP/loadgen.err" | grep '^RESULT')
    [ -n "$line" ] || line="RESULT label=$label status=loadgen-failed"
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        line="$line server_died=1"
    fi
    echo "$line" >>"$RESULTS"
    echo "$line" >&2
    if [ -s "$TMP/loadgen.err" ]; then
        sed 's/^/    /' "$TMP/loadgen.err" >&2
    fi
    stop_server
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -m), $(nproc) cores; torch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null || echo absent)" >&2

for k in $CONNS; do
    for p in $PATTERNS; do
        common=(--mode ops --pattern "$p" --conns "$k" --duration "$DURATION" --timeout 120)
        for _ in $(seq "$REPEAT"); do
            run torch "torch/legacy/$p/$k" --dialect legacy "${common[@]}"
            run ours "ours/legacy/$p/$k" --dialect legacy "${common[@]}"
            run ours "ours/current/$p/$k" --dialect current "${common[@]}"
        done
    done
done

# Rendezvous: connect, ADD init/, barrier, publish 64 bytes, make sure all
# are published, read all. "sync=barrier": a second barrier before reading
# (then MULTI_GET / GETs straight away); "sync=wait": one WAIT on all N keys,
# what PyTorch's multi_get client sends before MULTI_GET (it registers up to
# N^2/2 key waits in the server: see bench/README.md).
for n in $RANKS; do
    run ours "ours/cur,BARRIER,sync=barrier/rdzv/$n" --mode rdzv --ranks "$n" --dialect current \
        --barrier cmd --sync barrier --read multiget --timeout 120
    run ours "ours/cur,ADD+WAIT,sync=barrier/rdzv/$n" --mode rdzv --ranks "$n" --dialect current \
        --barrier add --sync barrier --read multiget --timeout 120
    run ours "ours/cur,BARRIER,sync=wait/rdzv/$n" --mode rdzv --ranks "$n" --dialect current \
        --barrier cmd --sync wait --read multiget --timeout 120
    run ours "ours/legacy,ADD+WAIT,sync=barrier/rdzv/$n" --mode rdzv --ranks "$n" --dialect legacy \
        --barrier add --sync barrier --read get --timeout "$LEGACY_RDZV_TIMEOUT"
    run torch "torch/legacy,ADD+WAIT,sync=barrier/rdzv/$n" --mode rdzv --ranks "$n" --dialect legacy \
        --barrier add --sync barrier --read get --timeout "$LEGACY_RDZV_TIMEOUT"
done

if [ "$IDLE" -gt 0 ]; then
    run ours "ours/legacy/idle/$IDLE" --mode idle --conns "$IDLE" --dialect legacy --timeout 120
    run ours "ours/current/idle/$IDLE" --mode idle --conns "$IDLE" --dialect current --timeout 120
    run torch "torch/legacy/idle/$IDLE" --mode idle --conns "$IDLE" --dialect legacy --timeout 120
fi

[ -n "$RAW" ] && cp "$RESULTS" "$RAW"

# The table: any python3 will do for formatting.
python3 - "$RESULTS" <<'EOF'
import sys

rows = []
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
    rows.append(kv)


def better(a, b):
    """The run to show: a clean one before a failed one, then the fastest."""
    key = lambda r: (r.get("status") == "ok" and not r.get("server_died"), float(r.get("ops_s", 0) or 0))
    return b if key(b) > key(a) else a


by, runs = {}, {}
for r in rows:
    runs.setdefault(r["label"], []).append(r)
    by[r["label"]] = better(by[r["label"]], r) if r["label"] in by else r
# A failure in any repetition is reported, even when another one was clean.
failed_runs = {l: [r for r in rs if r.get("status") != "ok" or r.get("server_died")]
               for l, rs in runs.items()}

def ops(label):
    r = by.get(label)
    if r is None:
        return None, "-"
    if r.get("status") != "ok" or r.get("server_died"):
        why = r.get("status", "?")
        if r.get("server_died"):
            why += ",server died"
        if r.get("connected") and r.get("conns") and r["connected"] != r["conns"]:
            why += ",%s/%s connected" % (r["connected"], r["conns"])
        if r.get("resets", "0") != "0":
            why += ",%s resets" % r["resets"]
        return (float(r["ops_s"]) if float(r.get("ops_s", 0) or 0) > 0 else None), why
    return float(r["ops_s"]), ""

def lat(label):
    r = by.get(label)
    if not r or "p50_us" not in r:
        return "-"
    return "%s/%s" % (r["p50_us"], r["p99_us"])

def cpu(label):
    """Server CPU time per op in us: robust to neighbours stealing cycles."""
    r = by.get(label)
    try:
        return "%.1f" % (float(r["server_cpu"]) * 1e6 / float(r["ops_s"]))
    except (TypeError, KeyError, ValueError, ZeroDivisionError):
        return "-"


def spread(label):
    v = [float(r.get("ops_s", 0) or 0) for r in runs.get(label, [])]
    return "%.0f..%.0f" % (min(v), max(v)) if len(v) > 1 else ""

print("## ops/s (one request in flight per connection; best of the repetitions; p50/p99 latency in us;")
print("## srv = server CPU per op in us; ratio = ops/s over PyTorch 1.13's)")
hdr = "%-8s %5s | %10s %15s %5s | %10s %15s %5s %6s | %10s %15s %5s %6s" % (
    "pattern", "K", "torch1.13", "p50/p99", "srv", "ours-leg", "p50/p99", "srv", "ratio",
    "ours-cur", "p50/p99", "srv", "ratio")
print(hdr)
print("-" * len(hdr))
notes, spreads = [], []
ks, pats = [], []
for r in rows:
    if r.get("mode") == "ops" or r["label"].count("/") == 3 and "/rdzv/" not in r["label"] and "/idle/" not in r["label"]:
        _, _, p, k = r["label"].split("/")
        if k not in ks:
            ks.append(k)
        if p not in pats:
            pats.append(p)
for k in ks:
    for p in pats:
        t, tn = ops("torch/legacy/%s/%s" % (p, k))
        l, ln = ops("ours/legacy/%s/%s" % (p, k))
        c, cn = ops("ours/current/%s/%s" % (p, k))
        f = lambda v: "%10.0f" % v if v is not None else "%10s" % "-"
        ratio = lambda v: "%5.2fx" % (v / t) if v is not None and t else "%6s" % "-"
        print("%-8s %5s | %s %15s %5s | %s %15s %5s %6s | %s %15s %5s %6s" % (
            p, k, f(t), lat("torch/legacy/%s/%s" % (p, k)), cpu("torch/legacy/%s/%s" % (p, k)),
            f(l), lat("ours/legacy/%s/%s" % (p, k)), cpu("ours/legacy/%s/%s" % (p, k)), ratio(l),
            f(c), lat("ours/current/%s/%s" % (p, k)), cpu("ours/current/%s/%s" % (p, k)), ratio(c)))
        for name, n, lab in (("torch1.13", tn, "torch/legacy"), ("ours-leg", ln, "ours/legacy"),
                             ("ours-cur", cn, "ours/current")):
            label = "%s/%s/%s" % (lab, p, k)
            if n and n != "-":
                notes.append("  %s %s K=%s: %s" % (name, p, k, n))
            for fr in failed_runs.get(label, []):
                if fr is not by.get(label):
                    notes.append("  %s %s K=%s: one repetition %s (%s/%s connected, %s resets)" % (
                        name, p, k, fr.get("status"), fr.get("connected", "?"), fr.get("conns", "?"),
                        fr.get("resets", "?")))
            sp = spread(label)
            if sp:
                spreads.append("%s %s K=%s: %s" % (name, p, k, sp))
if notes:
    print("notes:")
    print("\n".join(notes))
if spreads:
    print("ops/s range over the repetitions (min..max):")
    for i in range(0, len(spreads), 3):
        print("  " + "; ".join(spreads[i:i + 3]))

print()
print("## rendezvous (seconds from start until the last rank finished each phase; cpu: seconds used)")
hdr = "%-42s %6s %8s | %8s %8s %8s %8s %8s | %7s %7s" % (
    "server/dialect,barrier,sync/read", "ranks", "status", "connect", "init", "barrier",
    "publish", "total", "srv cpu", "gen cpu")
print(hdr)
print("-" * len(hdr))
for r in rows:
    if "/rdzv/" not in r["label"]:
        continue
    who, n = r["label"].split("/rdzv/")
    st = r.get("status", "?")
    if r.get("server_died"):
        st += ",server died"
    total = r.get("total_s", "-")
    if st != "ok":
        total = ">" + total if st == "timeout" else total
        extra = []
        if r.get("stuck_in"):
            extra.append("slowest rank in phase '%s'" % r["stuck_in"])
        if r.get("done"):
            extra.append("%s/%s ranks done" % (r["done"], n))
        if r.get("resets", "0") != "0":
            extra.append("%s resets" % r["resets"])
        if r.get("connect_retries", "0") != "0":
            extra.append("%s connect retries" % r["connect_retries"])
        st += " (" + ", ".join(extra) + ")" if extra else ""
    print("%-42s %6s %8s | %8s %8s %8s %8s %8s | %7s %7s" % (
        who + "/" + r.get("read", "?"), n, st.split(" ")[0], r.get("connect_s", "-"),
        r.get("init_s", "-"), r.get("barrier_s", "-"), r.get("publish_wait_s", "-"), total,
        r.get("server_cpu_s", "-"), r.get("gen_cpu_s", "-")))
    if " " in st:
        print("    " + st)

print()
print("## memory per idle connection (server VmRSS after - before) / connections")
for r in rows:
    if "/idle/" not in r["label"]:
        continue
    print("%-20s %6s conns  %8s KiB -> %8s KiB  %6s bytes/conn  %s" % (
        r["label"].rsplit("/idle/", 1)[0], r.get("connected", "-"), r.get("rss_before_kib", "-"),
        r.get("rss_after_kib", "-"), r.get("bytes_per_conn", "-"), r.get("status", "?")))
EOF
