#!/usr/bin/env bash
# Interface lists for the tcp backend (docs/tcp_backend.md, "Several
# interfaces"): two network namespaces joined by two veth pairs, named rail0
# and rail1 on both sides (10.N.1.0/24 and 10.N.2.0/24), one rank in each,
# rank 0 hosting the store on its rail0 address.
#
#   (a) C10D_SOCKET_IFNAME=rail0,rail1 on both ranks: c10d-bench checks the
#       results of all_reduce (4 B .. 8 MiB: one-lane ops round robin, multi-
#       lane ones striped), all_gather, broadcast and sendrecv; both rails'
#       byte counters (/sys/class/net/*/statistics) must grow by at least
#       1 MiB each, and rank 0 logs its two rails.
#   (b) the same with GLOO_SOCKET_IFNAME and C10D_TCP_LAZY_INIT=1.
#   (c) rank 0 lists rail0,rail1, rank 1 rail0 alone: both fail group
#       creation within CASE_S seconds, each naming the other's count.
#   BENCH=1 also times all_reduce of BENCH_BYTES over one rail and over two
#   (veth pairs on one host share its CPUs: not a NIC measurement).
#
# usage: rails_test.sh PATH/TO/c10d-bench
# env: CASE_S (60), BENCH=1, BENCH_BYTES (64M), BENCH_RATE (a tc rate per
#      veth, e.g. 1gbit; none by default), KEEP_LOGS=1
# Exit: 0 pass, 1 fail, 77 skipped (not root, or no namespaces / veth).
set -u

BENCHX=${1:?usage: rails_test.sh PATH/TO/c10d-bench}
BENCHX=$(realpath "$BENCHX")
CASE_S=${CASE_S:-60}

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: needs root and iproute2 (ip netns)"
    exit 77
fi

. "$(dirname "$0")/netns.sh"
TAG=$(printf '%x%04x' $$ $RANDOM | tail -c 8)
NSA=c10drail-$TAG-a
NSB=c10drail-$TAG-b
NET=10.$((RANDOM % 200 + 20))
PORT=29500
DIR=$(mktemp -d "${TMPDIR:-/tmp}/c10d_rails.XXXXXX")
PIDS=()
FAILS=0

cleanup() {
    local p ns
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    netns_gone "$NSA" "$NSB" # takes the veth pairs with them
    if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs kept in $DIR"; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*"
    FAILS=$((FAILS + 1))
}
pass() { echo "ok:   $*"; }

setup() {
    netns_two "$NSA" "$NSB" || return 1
    local k
    for k in 0 1; do
        # Made with unique names in this namespace, renamed once inside theirs.
        ip link add "cr${TAG}a$k" type veth peer name "cr${TAG}b$k" &&
            ip link set "cr${TAG}a$k" netns "$NSA" && ip link set "cr${TAG}b$k" netns "$NSB" &&
            ip -n "$NSA" link set "cr${TAG}a$k" name "rail$k" &&
            ip -n "$NSB" link set "cr${TAG}b$k" name "rail$k" &&
            ip -n "$NSA" addr add "$NET.$((k + 1)).1/24" dev "rail$k" &&
            ip -n "$NSB" addr add "$NET.$((k + 1)).2/24" dev "rail$k" &&
            ip -n "$NSA" link set "rail$k" up && ip -n "$NSB" link set "rail$k" up || return 1
        if [ -n "${BENCH_RATE:-}" ]; then
            ip netns exec "$NSA" tc qdisc add dev "rail$k" root tbf rate "$BENCH_RATE" burst 256k latency 50ms &&
                ip netns exec "$NSB" tc qdisc add dev "rail$k" root tbf rate "$BENCH_RATE" burst 256k latency 50ms || return 1
        fi
    done
}

if ! setup 2>"$DIR/setup.err"; then
    echo "SKIP: cannot make network namespaces and veth pairs here: $(head -c 300 "$DIR/setup.err")"
    exit 77
fi

bytes() { # namespace interface: bytes sent + received
    ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes" "/sys/class/net/$2/statistics/rx_bytes" |
        awk '{s += $1} END {print s}'
}

# run_pair NAME "ENV0" "ENV1" BENCH-ARGS...: one rank per namespace, each
# with its own environment words; waits up to CASE_S; sets RC0 RC1.
run_pair() {
    local name=$1 env0=$2 env1=$3
    shift 3
    local k ns envk pid
    PIDS=()
    for k in 0 1; do
        if [ $k = 0 ]; then ns=$NSA envk=$env0; else ns=$NSB envk=$env1; fi
        # shellcheck disable=SC2086 # the environment words split on purpose
        ip netns exec "$ns" env C10D_SHM=0 C10D_LOG_LEVEL=INFO MASTER_ADDR="$NET.1.1" \
            MASTER_PORT=$PORT RANK=$k WORLD_SIZE=2 $envk timeout -k 5 "$CASE_S" "$BENCHX" "$@" \
            >"$DIR/$name.$k.log" 2>&1 &
        PIDS+=($!)
    done
    wait "${PIDS[0]}"
    RC0=$?
    wait "${PIDS[1]}"
    RC1=$?
    PIDS=()
}

check_ok() { # name
    if [ "$RC0" = 0 ] && [ "$RC1" = 0 ]; then pass "$1: both ranks exit 0"; else
        fail "$1: exit status $RC0 and $RC1"
        tail -n 15 "$DIR/$1.0.log" "$DIR/$1.1.log" | sed 's/^/    | /'
    fi
}

# ---------- (a) and (b)
for mode in a b; do
    if [ $mode = a ]; then env="C10D_SOCKET_IFNAME=rail0,rail1"; else
        env="GLOO_SOCKET_IFNAME=rail0,rail1 C10D_TCP_LAZY_INIT=1"
    fi
    echo "($mode) $env"
    b0=$(bytes "$NSA" rail0) b1=$(bytes "$NSA" rail1)
    ok=1
    for op in all_reduce all_gather broadcast sendrecv; do
        run_pair "$mode-$op" "$env" "$env" -o "$op" -b 4 -e 8M -f 8 -n 3 -w 1 -c 1
        check_ok "$mode-$op" || ok=0
    done
    d0=$(($(bytes "$NSA" rail0) - b0)) d1=$(($(bytes "$NSA" rail1) - b1))
    if [ "$d0" -ge 1048576 ] && [ "$d1" -ge 1048576 ]; then
        pass "($mode) both rails carried traffic: rail0 $d0 B, rail1 $d1 B"
    else
        fail "($mode) rail0 carried $d0 B, rail1 $d1 B (want >= 1 MiB each)"
    fi
    if grep -q "2 rails over interfaces rail0,rail1" "$DIR/$mode-all_reduce.0.log"; then
        pass "($mode) rank 0 logs its two rails"
    else
        fail "($mode) rank 0 does not log its two rails"
        grep -i "tcp" "$DIR/$mode-all_reduce.0.log" | head -5 | sed 's/^/    | /'
    fi
done

# ---------- (c) lists of different lengths
echo "(c) rank 0: rail0,rail1; rank 1: rail0"
start=$(date +%s)
run_pair c "C10D_SOCKET_IFNAME=rail0,rail1" "C10D_SOCKET_IFNAME=rail0" -o all_reduce -b 4 -e 4 -n 1 -w 0
took=$(($(date +%s) - start))
if [ "$RC0" != 0 ] && [ "$RC1" != 0 ] && [ "$RC0" != 124 ] && [ "$RC1" != 124 ]; then
    pass "(c) both ranks fail (exit $RC0, $RC1) in ${took}s"
else
    fail "(c) exit status $RC0 and $RC1 after ${took}s (want both to fail, no timeout)"
fi
for k in 0 1; do
    other=$((1 - k)) want=$((k == 0 ? 1 : 2)) mine=$((k == 0 ? 2 : 1))
    if grep -q "rank $other published $want address(es).*rank $k listens on $mine" "$DIR/c.$k.log"; then
        pass "(c) rank $k names rank $other's $want address(es) and its own count"
    else
        fail "(c) rank $k's error does not name both counts:"
        grep -v " I " "$DIR/c.$k.log" | head -5 | sed "s/^/    | /"
    fi
done

# ---------- timings (optional)
if [ "${BENCH:-0}" = 1 ]; then
    sz=${BENCH_BYTES:-64M}
    for env in "C10D_SOCKET_IFNAME=rail0" "C10D_SOCKET_IFNAME=rail0,rail1"; do
        run_pair bench "$env" "$env" -o all_reduce -b "$sz" -e "$sz" -n 10 -w 2 -c 0
        echo "bench $env (${BENCH_RATE:-no tc limit}):"
        grep -vE "INFO|^#$" "$DIR/bench.0.log" | tail -n 3 | sed 's/^/    | /'
    done
fi

if [ "$FAILS" -gt 0 ]; then
    echo "$FAILS check(s) failed"
    exit 1
fi
echo "all passed"
