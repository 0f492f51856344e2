#!/usr/bin/env bash
# Host-aware against flat collectives across two "hosts" (network namespaces joined by one
# veth pair), same run: 4 ranks, 2 per host, blocking ops (c10d-bench -z 1), the host-aware
# path (C10D_SHM=1, the default) and flat tcp (C10D_SHM=0) alternating, each row the best of
# REPEAT runs. RATE (e.g. 1gbit) limits the veth pair with tc, as a NIC would; the default is
# no limit (the veth moves bytes at memcpy speed through the kernel, so this shows the
# protocol's cost, not a network's). Root only.
#
# usage: bench/hier_compare.sh BUILD [OP] [REPEAT] [OTHER_BUILD]
#   (OP: all_reduce (default), broadcast, reduce, all_gather, reduce_scatter)
#   OTHER_BUILD: another build's host-aware path as a third column, in the same rounds (an
#   A/B of a change to it)
# env: RATE, ITERS (200), CHECKS (1), SIZES (c10d-bench's, "-b 4 -e 16M -f 16"), STAT (mean, or
# p50: the median op, steadier where the VM's neighbours stall a few ops)
set -u
BUILD=$(realpath "${1:?usage: hier_compare.sh BUILD [OP] [REPEAT] [OTHER_BUILD]}")
OP=${2:-all_reduce}
REPEAT=${3:-3}
OTHER=${4:+$(realpath "$4")}
. "$(dirname "$0")/../test/net/netns.sh"
[ "$(id -u)" = 0 ] || {
    echo "needs root (ip netns)"
    exit 1
}
TAG=$(printf '%x%04x' $$ $RANDOM | tail -c 8)
NS=(hb-$TAG-a hb-$TAG-b)
IF0=hb${TAG}a
IF1=hb${TAG}b
NET=10.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1))
T=$(mktemp -d)
cleanup() {
    netns_gone "${NS[@]}"
    rm -rf "$T"
}
trap cleanup EXIT
netns_two "${NS[@]}" && netns_link "${NS[@]}" "$IF0" "$IF1" "$NET.1/24" "$NET.2/24" || exit 1
if [ -n "${RATE:-}" ]; then
    for k in 0 1; do
        ifn=$IF0
        [ $k = 1 ] && ifn=$IF1
        ip netns exec "${NS[$k]}" tc qdisc add dev "$ifn" root tbf rate "$RATE" burst 256kb latency 50ms
    done
fi
PORT=29700
# run SHM [BUILD]: one c10d-bench over 4 ranks (0, 1 on host A; 2, 3 on host B); rank 0's table
# on stdout.
run() {
    local benchx=${2:-$BUILD}/bench/c10d-bench
    PORT=$((PORT + 1))
    local r ns ifn pids=()
    for r in 0 1 2 3; do
        if [ $r -lt 2 ]; then ns=${NS[0]} ifn=$IF0; else ns=${NS[1]} ifn=$IF1; fi
        ip netns exec "$ns" env C10D_SHM="$1" MASTER_ADDR="$NET.1" MASTER_PORT=$PORT RANK=$r \
            WORLD_SIZE=4 C10D_SOCKET_IFNAME="$ifn" timeout 300 "$benchx" -o "$OP" -z 1 \
            ${SIZES:--b 4 -e 16M -f 16} -n "${ITERS:-200}" -w 20 -c "${CHECKS:-1}" >"$T/r$r.out" 2>"$T/r$r.err" &
        pids+=($!)
    done
    wait "${pids[@]}"
    local col=6
    [ "${STAT:-mean}" = p50 ] && col=10
    grep -vE '^\s*#' "$T/r0.out" | awk -v c=$col 'NF >= 10 {print $1, $c}'
}
declare -A best
for ((i = 0; i < REPEAT; i++)); do
    for mode in 1 0 ${OTHER:+other}; do
        while read -r size t; do
            k="$mode:$size"
            if [ -z "${best[$k]:-}" ] || awk -v a="$t" -v b="${best[$k]}" 'BEGIN{exit !(a < b)}'; then
                best[$k]=$t
            fi
        done < <(if [ $mode = other ]; then run 1 "$OTHER"; else run $mode; fi)
    done
done
echo "$OP, 4 ranks on 2 hosts (2 + 2, network namespaces, veth${RATE:+ limited to $RATE}), blocking, best of $REPEAT (${STAT:-mean} time per op in us)"
if [ -n "$OTHER" ]; then
    echo "other build: $OTHER"
    printf '%10s | %12s %12s %12s | %s %s\n' size host-aware other flat "host-aware / flat" \
        "host-aware / other"
else
    printf '%10s | %12s %12s | %s\n' size host-aware flat "host-aware / flat"
fi
for size in 4 64 1024 16384 262144 1048576 4194304 16777216; do
    a=${best["1:$size"]:-} b=${best["0:$size"]:-} o=${best["other:$size"]:-}
    [ -n "$a" ] && [ -n "$b" ] || continue
    if [ -n "$OTHER" ]; then
        printf '%10s | %12s %12s %12s | %.2f %.2f\n' "$size" "$a" "$o" "$b" \
            "$(awk -v a="$a" -v b="$b" 'BEGIN{print a/b}')" "$(awk -v a="$a" -v o="$o" 'BEGIN{print a/o}')"
    else
        printf '%10s | %12s %12s | %s\n' "$size" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.2f", a/b}')"
    fi
done
