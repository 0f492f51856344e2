#!/bin/sh
# c10d-bench's P2P patterns, results checked on every rank (-c 1): sendrecv
# (a batch per rank: send to the next, receive from the previous) and
# pingpong (single blocking sends and receives between ranks 2k and 2k+1),
# on shared memory and on tcp alone, 2 and 4 ranks, sizes across the eager
# limit; pingpong on an odd number of ranks is refused by name.
#   test_bench_p2p.sh C10DRUN C10D_BENCH
set -u
run=$1
bench=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT INT TERM
fail() {
    echo "FAIL: $*" >&2
    cat "$out" >&2
    exit 1
}
for shm in 1 0; do
    for n in 2 4; do
        for op in sendrecv pingpong; do
            C10D_SHM=$shm timeout 120 "$run" -n "$n" --no-prefix "$bench" -o "$op" -b 4 -e 256K \
                -f 16 -n 20 -w 2 -z 1 -c 1 >"$out" 2>&1
            rc=$?
            [ "$rc" = 0 ] || fail "$op, $n ranks, C10D_SHM=$shm: exit status $rc"
            grep -q "Out of bounds values : 0 OK" "$out" ||
                fail "$op, $n ranks, C10D_SHM=$shm: results not reported correct"
            echo "ok: $op, $n ranks, C10D_SHM=$shm"
        done
    done
done
timeout 60 "$run" -n 3 --no-prefix "$bench" -o pingpong -b 4 -e 4 -n 2 -w 1 >"$out" 2>&1
rc=$?
[ "$rc" != 0 ] || fail "pingpong on 3 ranks succeeded"
grep -q "pingpong needs an even number of ranks" "$out" || fail "pingpong on 3 ranks: no reason given"
echo "ok: pingpong on 3 ranks refused"
