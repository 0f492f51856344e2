#!/usr/bin/env bash
# User-space instructions per request of store_floor and c10d-store under
# valgrind --tool=callgrind: a second measure next to store_floor_compare.sh
# that neighbours cannot disturb (the kernel's share is not counted).
#
#   bench/store_floor_callgrind.sh BUILD_DIR [--conns K] [--patterns "get add"]
#                                  [--dialect legacy|current] [--store PATH]
#                                  [--servers "floor ours"]
#
# Per server and pattern: counters zeroed, a short and a long load generator
# run, each followed by a dump; instructions per op = (Ir long - Ir short) /
# (ops long - ops short), ops counting every op answered (ops_all), so the
# connections' setup, the same in both runs, cancels out.
set -u

[ $# -ge 1 ] || { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
BUILD=$1
shift
CONNS=256
PATTERNS="get add"
DIALECT=legacy
STORE=$BUILD/store_server/c10d-store
SERVERS="floor ours"
while [ $# -gt 0 ]; do
    case $1 in
    --conns) CONNS=$2; shift 2 ;;
    --patterns) PATTERNS=$2; shift 2 ;;
    --dialect) DIALECT=$2; shift 2 ;;
    --store) STORE=$2; shift 2 ;;
    --servers) SERVERS=$2; shift 2 ;;
    *) echo "store_floor_callgrind.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
LOADGEN=$BUILD/bench/store_loadgen
FLOOR=$BUILD/bench/store_floor
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 2; }

TMP=$(mktemp -d /tmp/store_cg.XXXXXX)
VPID=""
cleanup() {
    [ -n "$VPID" ] && kill "$VPID" 2>/dev/null && wait "$VPID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

# The Ir total of the newest dump.
last_ir() {
    local f
    f=$(ls -t "$TMP"/cg.out.* | head -1)
    awk '/^summary:/ {print $2}' "$f"
}

ops_of() {
    sed -n 's/.* ops_all=\([0-9]*\) .*/\1/p'
}

for name in $SERVERS; do
    rm -f "$TMP"/cg.out* "$TMP/port"
    if [ $name = floor ]; then
        cmd=("$FLOOR" --port-file "$TMP/port")
    else
        cmd=("$STORE" serve --host 127.0.0.1 --port 0 --port-file "$TMP/port" --stats-interval-s 0)
    fi
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.out.%p" "${cmd[@]}" \
        >"$TMP/vg.out" 2>"$TMP/vg.err" &
    VPID=$!
    for _ in $(seq 600); do
        [ -s "$TMP/port" ] && break
        sleep 0.1
    done
    port=$(cat "$TMP/port")
    for p in $PATTERNS; do
        gen=("$LOADGEN" --port "$port" --dialect "$DIALECT" --mode ops --pattern "$p"
            --conns "$CONNS" --warmup 0.5 --timeout 120)
        "${gen[@]}" --duration 1 >/dev/null 2>&1 # keys and counters exist from here on
        callgrind_control -z "$VPID" >/dev/null 2>&1
        o1=$("${gen[@]}" --duration 2 2>/dev/null | ops_of)
        callgrind_control -d "$VPID" >/dev/null 2>&1
        i1=$(last_ir)
        callgrind_control -z "$VPID" >/dev/null 2>&1
        o2=$("${gen[@]}" --duration 6 2>/dev/null | ops_of)
        callgrind_control -d "$VPID" >/dev/null 2>&1
        i2=$(last_ir)
        awk -v n="$name" -v p="$p" -v i1="$i1" -v i2="$i2" -v o1="$o1" -v o2="$o2" 'BEGIN {
            printf "%-6s %-4s instructions/request %7.0f   (Ir %d/%d over ops %d/%d)\n",
                n, p, (i2 - i1) / (o2 - o1), i1, i2, o1, o2 }'
    done
    kill "$VPID"
    wait "$VPID" 2>/dev/null
    VPID=""
done
