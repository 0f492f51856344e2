#!/usr/bin/env bash
# c10drun across two "nodes": two network namespaces joined by a veth pair, one c10drun in
# each, two ranks per node, node 0's c10drun hosting the store at its veth address.
#   1. ddp_tiny on 4 ranks: both nodes succeed (node 1 is started first: it waits for the store;
#      its options come from PET_* variables)
#   2. a rank of node 1 fails: node 0's c10drun names it and stops its own ranks
#      and when a rank of node 1 dies mid-training, node 0's ranks report it
#   3. --max-restarts 1: a rank of node 1 fails on attempt 0; both nodes restart, and
#      ddp_tiny succeeds on attempt 1 (TORCHELASTIC_RESTART_COUNT=1 on every rank)
# Root only (ip netns); exits 77 (skipped) otherwise.
#
# usage: test_c10drun_nodes.sh PATH/TO/c10drun PATH/TO/ddp_tiny
set -u

RUN=${1:?usage: test_c10drun_nodes.sh PATH/TO/c10drun PATH/TO/ddp_tiny}
TINY=${2:?usage: test_c10drun_nodes.sh PATH/TO/c10drun PATH/TO/ddp_tiny}
RUN=$(realpath "$RUN")
TINY=$(realpath "$TINY")
export TINY # the ranks' shell scripts run it
. "$(dirname "$0")/net/netns.sh"

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: needs root and iproute2 (ip netns)"
    exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/test_c10drun_nodes.XXXXXX")
# Names free on this host: our pid and a random tag (interface names: 15 characters at most).
TAG=$(printf '%x%04x' $$ $RANDOM | tail -c 8)
NS0=c10drun-$TAG-0
NS1=c10drun-$TAG-1
IF0=c10d${TAG}a
IF1=c10d${TAG}b
# A private /24 picked at random; inside the namespaces nothing else uses it.
NET=10.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))
ADDR0=$NET.1
ADDR1=$NET.2
PORT=29500
BG=()
FAILS=0

cleanup() {
    local p
    for p in "${BG[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    # Whatever still runs inside a namespace (a rank left behind) goes with it.
    netns_gone "$NS0" "$NS1"
    ip link del "$IF0" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*"
    FAILS=$((FAILS + 1))
}
pass() { echo "ok:   $*"; }

expect_rc() {
    if [ "$2" = "$3" ]; then pass "$1: exit status $2"; else fail "$1: exit status $2, want $3"; fi
}

expect_match() { # name file regex
    if grep -qE -- "$3" "$2"; then pass "$1: matches '$3'"; else
        fail "$1: nothing matches '$3' in $2:"
        sed 's/^/    | /' "$2"
    fi
}

setup() {
    netns_two "$NS0" "$NS1" && netns_link "$NS0" "$NS1" "$IF0" "$IF1" "$ADDR0/24" "$ADDR1/24"
}
if ! setup 2>"$T/setup.err"; then
    echo "SKIP: cannot make network namespaces here: $(cat "$T/setup.err")"
    exit 77
fi

# node NAME NODE_RANK [c10drun options...] -- PROGRAM...: runs one node in the background,
# bounded; its output goes to $T/NAME.out and $T/NAME.err, its status to $T/NAME.rc.
node() {
    local name=$1 node_rank=$2 ns ifname
    shift 2
    if [ "$node_rank" = 0 ]; then ns=$NS0 ifname=$IF0; else ns=$NS1 ifname=$IF1; fi
    (
        ip netns exec "$ns" env C10D_SOCKET_IFNAME="$ifname" C10D_TRACE_FILE_PREFIX="$T/fr_$name" timeout -k 10 120 "$RUN" "$@" \
            >"$T/$name.out" 2>"$T/$name.err"
        echo $? >"$T/$name.rc"
    ) &
    BG+=($!)
}

wait_nodes() {
    local p
    for p in "${BG[@]}"; do
        wait "$p" 2>/dev/null
    done
    BG=()
}

# ---------------------------------------------------------------- 1. ddp_tiny on 2 x 2 ranks
start=$(date +%s%N)
# Node 1 first, its options from PET_* (torchrun's defaults for the flags): it must wait for
# node 0's store.
PET_NNODES=2 PET_NODE_RANK=1 PET_NPROC_PER_NODE=2 PET_RDZV_ENDPOINT=$ADDR0:$PORT \
    PET_RDZV_BACKEND=static node ok1 1 "$TINY" 30
sleep 1
node ok0 0 --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-endpoint "$ADDR0:$PORT" \
    --rdzv-backend c10d "$TINY" 30
wait_nodes
echo "two nodes of ddp_tiny: $((($(date +%s%N) - start) / 1000000)) ms (node 1 started 1 s early)"
expect_rc "nodes: node 0" "$(cat "$T/ok0.rc")" 0
expect_rc "nodes: node 1" "$(cat "$T/ok1.rc")" 0
expect_match "nodes: node 0" "$T/ok0.out" '^\[rank0\]: weights identical on all 4 ranks'
expect_match "nodes: node 0" "$T/ok0.out" '^\[rank0\]: loss .* on 4 ranks'

# ---------------------------------------------------------------- 2. a failure on node 1
# Every rank sleeps but rank 3 (node 1), which fails: node 0's c10drun hears it through the
# store and stops its ranks.
prog='if [ "$RANK" = 3 ]; then sleep 1; echo "rank 3 fails"; exit 7; fi; exec sleep 100'
for k in 1 0; do
    node fail$k $k --nnodes 2 --node-rank $k -n 2 --rdzv-endpoint "$ADDR0:$PORT" \
        --run-id failjob --failure-grace-ms 500 sh -c "$prog"
done
wait_nodes
expect_rc "node failure: node 1" "$(cat "$T/fail1.rc")" 7
expect_rc "node failure: node 0" "$(cat "$T/fail0.rc")" 1
expect_match "node failure: node 1" "$T/fail1.err" '^c10drun: rank 3 \(pid [0-9]+\) exited with status 7$'
expect_match "node failure: node 0" "$T/fail0.err" \
    '^c10drun: node 1: rank 3 \(pid [0-9]+\) exited with status 7; stopping this node.s ranks$'

# A rank of node 1 dies in the middle of training: node 0's ranks see the connection go and
# report it (the grace period lets them), and node 0's c10drun names the rank that died.
prog='if [ "$RANK" = 3 ]; then "$TINY" 1000000 & sleep 1; exit 9; fi; exec "$TINY" 1000000'
for k in 1 0; do
    node die$k $k --nnodes 2 --node-rank $k -n 2 --rdzv-endpoint "$ADDR0:$PORT" \
        --run-id diejob sh -c "$prog"
done
wait_nodes
expect_rc "rank dies: node 1" "$(cat "$T/die1.rc")" 9
if [ "$(cat "$T/die0.rc")" != 0 ]; then pass "rank dies: node 0 failed too"; else
    fail "rank dies: node 0 exited 0"
fi
expect_match "rank dies: node 0" "$T/die0.err" '^\[rank[01]\]: ddp_tiny: .*(rank [23]|closed|lost)'
expect_match "rank dies: node 0" "$T/die0.err" 'node 1: rank 3 \(pid [0-9]+\) exited with status 9'
echo "--- node 0's stderr when rank 3 died:"
grep -v ' W engine: a posted task' "$T/die0.err" | cut -c1-200
echo "---"

# ---------------------------------------------------------------- 3. restart of both nodes
prog='echo "attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then sleep 1; exit 3; fi
exec "$TINY" 30'
for k in 0 1; do
    node restart$k $k --nnodes 2 --node-rank $k -n 2 --rdzv-endpoint "$ADDR0:$PORT" \
        --max-restarts 1 --failure-grace-ms 500 sh -c "$prog"
done
wait_nodes
expect_rc "node restart: node 0" "$(cat "$T/restart0.rc")" 0
expect_rc "node restart: node 1" "$(cat "$T/restart1.rc")" 0
expect_match "node restart: node 0" "$T/restart0.out" '^\[rank1\]: attempt 1 of 1$'
expect_match "node restart: node 1" "$T/restart1.out" '^\[rank3\]: attempt 1 of 1$'
expect_match "node restart: node 0" "$T/restart0.err" '^c10drun: restarting the ranks: attempt 1'
expect_match "node restart: node 0" "$T/restart0.out" '^\[rank0\]: weights identical on all 4 ranks'

echo
if [ "$FAILS" = 0 ]; then
    echo "test_c10drun_nodes: all passed"
    exit 0
fi
echo "test_c10drun_nodes: $FAILS failure(s)"
exit 1
