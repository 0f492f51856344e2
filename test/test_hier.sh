#!/usr/bin/env bash
# Host-aware collectives across two "hosts": two network namespaces joined by a veth pair
# (each its own host id: docs/shm.md), ranks started by hand with env:// rendezvous so that
# the hosts' ranks interleave.
#   1. 5 ranks, 3 on host A (ranks 0, 2, 4) and 2 on host B (1, 3): hier_check passes on every
#      rank and the group reports the path "shm+tcp"
#   2. 4 ranks, 3 on A and 1 alone on B (a leader with no local peer)
#   3. C10D_SHM=0 on one rank: every rank stays flat ("tcp"), the results are the same
#   4. a rank of host B killed mid-run: every other rank fails within the bound, none hangs
#   5. mismatched calls, within a host (one rank's dtype) and between hosts (host B's): every
#      rank fails naming the mismatch
#   6. 4 ranks, 2 + 2 interleaved (abab): large all_reduces and reduces (every root) run by
#      slices, remainders too; a mismatch by slices fails every rank naming it
#   7. 6 ranks, 3 + 3 in contiguous ranges (ranks 0-2 on A, 3-5 on B): all_gather and
#      reduce_scatter run host-aware (as in cases 1 and 2: interleaved hosts of different
#      sizes, a leader alone on its host); the checks pass, and the bytes that cross between the hosts for 10 of each at
#      1 MiB per block are under 3/4 of what the same job moves flat (C10D_SHM=0 on one
#      rank), with the hosts contiguous and interleaved
# Root only (ip netns); exits 77 (skipped) otherwise.
#
# usage: test_hier.sh PATH/TO/hier_check
set -u

CHECK=${1:?usage: test_hier.sh PATH/TO/hier_check}
CHECK=$(realpath "$CHECK")
. "$(dirname "$0")/net/netns.sh"

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: needs root and iproute2 (ip netns)"
    exit 77
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/test_hier.XXXXXX")
TAG=$(printf '%x%04x' $$ $RANDOM | tail -c 8)
NS=(hier-$TAG-a hier-$TAG-b)
IF0=hi${TAG}a
IF1=hi${TAG}b
NET=10.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))
ADDR=($NET.1 $NET.2)
BG=()
FAILS=0

cleanup() {
    local p
    for p in "${BG[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    netns_gone "${NS[@]}"
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*"
    FAILS=$((FAILS + 1))
}
pass() { echo "ok:   $*"; }

setup() {
    netns_two "${NS[@]}" &&
        netns_link "${NS[@]}" "$IF0" "$IF1" "${ADDR[0]}/24" "${ADDR[1]}/24"
}
if ! setup 2>"$T/setup.err"; then
    echo "SKIP: cannot make network namespaces here: $(cat "$T/setup.err")"
    exit 77
fi

PORT=29611
# job NAME "HOSTS" [VAR=VALUE ...]: one rank per letter of HOSTS (a: host A, b: host B), rank
# i on the host of letter i; rank 0 (host A) hosts the store. Output in $T/NAME.<rank>.{out,err},
# status in $T/NAME.<rank>.rc.
# PER_RANK[r]: one more VAR=VALUE for rank r alone.
declare -A PER_RANK=()
job() {
    local name=$1 hosts=$2 n=${#2} r h ns ifname
    shift 2
    PORT=$((PORT + 1))
    for ((r = 0; r < n; r++)); do
        h=${hosts:r:1}
        if [ "$h" = a ]; then ns=${NS[0]} ifname=$IF0; else ns=${NS[1]} ifname=$IF1; fi
        (
            ip netns exec "$ns" env MASTER_ADDR="${ADDR[0]}" MASTER_PORT=$PORT RANK=$r \
                WORLD_SIZE=$n HIER_HOSTS="$hosts" C10D_SOCKET_IFNAME="$ifname" "$@" ${PER_RANK[$r]:-} \
                timeout -k 5 90 "$CHECK" \
                >"$T/$name.$r.out" 2>"$T/$name.$r.err"
            echo $? >"$T/$name.$r.rc"
        ) &
        BG+=($!)
    done
}

wait_job() {
    local p
    for p in "${BG[@]}"; do
        wait "$p" 2>/dev/null
    done
    BG=()
}

expect_all() { # name n want_rc
    local r rc
    for ((r = 0; r < $2; r++)); do
        rc=$(cat "$T/$1.$r.rc" 2>/dev/null || echo none)
        if [ "$rc" = "$3" ]; then pass "$1: rank $r: exit status $rc"; else
            fail "$1: rank $r: exit status $rc, want $3"
            sed 's/^/    | /' "$T/$1.$r.err" | tail -15
        fi
    done
}

# ---------------------------------------------------- 1. 3 + 2 ranks, interleaved
start=$(date +%s%N)
job hier5 ababa HIER_EXPECT_PATH=shm+tcp
wait_job
echo "5 ranks on 2 hosts: $((($(date +%s%N) - start) / 1000000)) ms"
expect_all hier5 5 0
# Small P2P between ranks of one host went through their mailboxes (host A: 0 -> 2 and
# 2 -> 4, step 2; 4 -> 0, step 1), the rest through rings and sockets.
lane_count() { # name rank sends|receives
    sed -n "s/^rank $2: P2P lane: \([0-9]*\) sends, \([0-9]*\) receives$/\1 \2/p" "$T/$1.$2.out" |
        awk -v w="$3" '{print (w == "sends" ? $1 : $2)}'
}
s0=$(lane_count hier5 0 sends)
r2=$(lane_count hier5 2 receives)
if [ "${s0:-0}" -gt 0 ] && [ "${r2:-0}" -gt 0 ]; then
    pass "hier5: P2P within host A took the mailboxes (rank 0: $s0 sends, rank 2: $r2 receives)"
else
    fail "hier5: P2P within host A did not take the mailboxes (rank 0 sends: ${s0:-none}, rank 2 receives: ${r2:-none})"
fi

# ---------------------------------------------------- 2. a host with one rank
job hier4 aaab HIER_EXPECT_PATH=shm+tcp
wait_job
expect_all hier4 4 0

# ---------------------------------------------------- 3. C10D_SHM=0 on one rank: flat
PER_RANK[3]=C10D_SHM=0
job flat ababa HIER_EXPECT_PATH=tcp
wait_job
PER_RANK=()
expect_all flat 5 0
s0=$(lane_count flat 0 sends)
if [ "${s0:-none}" = 0 ]; then pass "flat: no mailbox used"; else fail "flat: the mailboxes carried ${s0:-none} sends"; fi

# ---------------------------------------------------- 4. a rank killed mid-run
# Rank 3 (host B, not its leader) is killed while the others loop in the checks: each of
# them must fail (exit 1 or 2), none may hang until the test's own timeout.
job kill ababa HIER_EXPECT_PATH=shm+tcp HIER_LOOP=1
sleep 3
for p in $(ip netns pids "${NS[1]}"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=3' &&
        [ "$(readlink "/proc/$p/exe")" = "$CHECK" ]; then
        kill -KILL "$p"
    fi
done
start=$(date +%s%N)
wait_job
echo "after the kill, the others ended in $((($(date +%s%N) - start) / 1000000)) ms"
for r in 0 1 2 4; do
    rc=$(cat "$T/kill.$r.rc" 2>/dev/null || echo none)
    case $rc in
    1 | 2)
        if grep -q 'rank 3' "$T/kill.$r.err"; then pass "kill: rank $r failed (exit $rc), naming rank 3"; else
            fail "kill: rank $r failed without naming rank 3"
            tail -3 "$T/kill.$r.err" | sed 's/^/    | /'
        fi
        ;;
    *)
        fail "kill: rank $r: exit status $rc, want a failure"
        tail -5 "$T/kill.$r.err" | sed 's/^/    | /'
        ;;
    esac
done

# ---------------------------------------------------- 5. mismatches
for case in "3:within" "1,3:between"; do
    job "mm${case#*:}" ababa HIER_MISMATCH="${case%%:*}"
    wait_job
    expect_all "mm${case#*:}" 5 3
done

# ---------------------------------------------------- 6. equal hosts, interleaved: by slices
# Every large all_reduce and reduce (every root) runs by slices (each rank carries its slice
# between the hosts), which the DEBUG log says on every rank.
job slices abab HIER_EXPECT_PATH=shm+tcp C10D_LOG_LEVEL=DEBUG
wait_job
expect_all slices 4 0
for r in 0 1 2 3; do
    for kind in ALLREDUCE REDUCE; do
        if grep -q "rank [0-9]*: $kind seq [0-9]* by slices, 2 ranks per host" "$T/slices.$r.err"; then
            pass "slices: rank $r ran $kind by slices"
        else
            fail "slices: rank $r never ran $kind by slices"
        fi
    done
done
# A mismatch by slices (rank 3's dtype, 100000 elements): every rank fails naming it.
job mmslices abab HIER_MISMATCH=3 HIER_MISMATCH_COUNT=100000
wait_job
expect_all mmslices 4 3

# ---------------------------------------------------- 7. equal, contiguous hosts
job blocked aaabbb HIER_EXPECT_PATH=shm+tcp
wait_job
expect_all blocked 6 0

crossing() { # bytes received on host B's end of the link
    ip netns exec "${NS[1]}" cat "/sys/class/net/$IF1/statistics/rx_bytes"
}
declare -A CROSSED=()
for layout in aaabbb ababab; do
    for mode in hier flat; do
        [ $mode = flat ] && PER_RANK[4]=C10D_SHM=0
        before=$(crossing)
        job "traffic-$layout-$mode" $layout HIER_TRAFFIC=262144
        wait_job
        PER_RANK=()
        CROSSED[$mode]=$(($(crossing) - before))
        expect_all "traffic-$layout-$mode" 6 0
    done
    echo "bytes into host B ($layout), 10 all_gathers + 10 reduce_scatters of 1 MiB blocks:" \
        "host-aware ${CROSSED[hier]}, flat ${CROSSED[flat]}"
    if [ $((CROSSED[hier] * 4)) -lt $((CROSSED[flat] * 3)) ]; then
        pass "traffic ($layout): host-aware moves under 3/4 of the flat bytes between hosts"
    else
        fail "traffic ($layout): host-aware ${CROSSED[hier]} bytes, flat ${CROSSED[flat]}"
    fi
done

if [ "$FAILS" = 0 ]; then
    echo "test_hier: all passed"
    exit 0
fi
echo "test_hier: $FAILS failure(s)"
exit 1
