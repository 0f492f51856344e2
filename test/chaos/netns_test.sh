#!/usr/bin/env bash
# Multi-host over network namespaces: one rank per namespace, each with its
# own veth on a bridge (10.77.0.0/24, inside namespaces this script creates),
# C10D_SOCKET_IFNAME naming that veth, MASTER_ADDR = rank 0's address.
#
#   (a) a partition of one rank's link longer than the group timeout T must
#       fail every rank with C10D_ETIMEDOUT (or C10D_ECLOSED) within T + 2 s;
#       run with the partitioned rank being the last rank, then rank 0 (the
#       store's host);
#   (b) a 300 ms partition that heals must leave every op done and verified.
#
# A partition is `ip link set <veth> down` inside the rank's namespace: the
# kernel drops what either side sends until the link is up again (netem and
# iptables are not in every kernel/image; iproute2's link control is).
#
# usage: netns_test.sh PATH/TO/c10d_chaos
# env: NRANKS (3), T_MS (3000), SHORT_MS (300), KEEP_LOGS=1
# Exit: 0 pass, 1 fail, 77 skipped (not root, no namespaces/veth/bridge).
set -u

CHAOS=${1:?usage: netns_test.sh PATH/TO/c10d_chaos}
NRANKS=${NRANKS:-3}
T_MS=${T_MS:-3000}
SHORT_MS=${SHORT_MS:-300}
BOUND_MS=$((T_MS + 2000))
HARD_MS=$((T_MS + 10000))
PORT=29500

# Unique per run, so parallel runs never collide; interface names stay
# under the kernel's 15 characters.
NSP="c10dchaos-$$"
IFP="cx$$"
SW="$NSP-sw"
DIR=$(mktemp -d /tmp/c10d_netns.XXXXXX)
PIDS=()
NSS=()
FAILS=0

log() { printf '%s\n' "$*"; }

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null
    done
    PIDS=()
    # Deleting a namespace destroys the veths and the bridge inside it.
    for p in "${NSS[@]}"; do
        ip netns del "$p" 2>/dev/null
    done
    NSS=()
    if [ "${KEEP_LOGS:-0}" = 1 ] || [ "$FAILS" -ne 0 ]; then
        log "logs kept in $DIR"
    else
        rm -rf "$DIR"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

skip() {
    log "SKIP: $*"
    exit 77
}

# kill -0 succeeds on a zombie: look at the process state instead.
is_running() {
    local st
    [ -r "/proc/$1/stat" ] || return 1
    read -r _ _ st _ <"/proc/$1/stat" 2>/dev/null || return 1
    [ "$st" != Z ]
}

now_ms() {
    local t=${EPOCHREALTIME/./}
    echo $((t / 1000))
}

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip (iproute2)"
[ -x "$CHAOS" ] || {
    log "FAIL: $CHAOS is not executable"
    exit 1
}

# ------------------------------------------------------------------ setup
ip netns add "$SW" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
NSS+=("$SW")
ip -n "$SW" link add "${IFP}br" type bridge 2>/dev/null || skip "no bridge support"
ip -n "$SW" link set "${IFP}br" up
for ((k = 0; k < NRANKS; k++)); do
    ns="$NSP-$k"
    ip netns add "$ns" || skip "cannot create namespace $ns"
    NSS+=("$ns")
    ip link add "${IFP}v${k}" type veth peer name "${IFP}s${k}" 2>/dev/null || skip "no veth support"
    ip link set "${IFP}v${k}" netns "$ns" || skip "cannot move a veth into $ns"
    ip link set "${IFP}s${k}" netns "$SW" || skip "cannot move a veth into $SW"
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.77.0.$((k + 1))/24" dev "${IFP}v${k}"
    ip -n "$ns" link set "${IFP}v${k}" up
    ip -n "$SW" link set "${IFP}s${k}" master "${IFP}br"
    ip -n "$SW" link set "${IFP}s${k}" up
done
# The bridge forwards at once (no STP); check that rank 0 is reachable.
for ((k = 1; k < NRANKS; k++)); do
    ok=0
    for _ in $(seq 50); do
        if ip netns exec "$NSP-$k" timeout 1 bash -c "exec 3<>/dev/tcp/10.77.0.1/9" 2>&1 |
            grep -q -i "refused"; then
            ok=1
            break
        fi
        sleep 0.1
    done
    [ "$ok" = 1 ] || skip "namespace $k cannot reach 10.77.0.1 over the bridge"
done
log "netns: $NRANKS ranks in $NSP-{0..$((NRANKS - 1))}, bridge ${IFP}br in $SW, T=${T_MS} ms"

# ----------------------------------------------------------------- helpers
# start_ranks TAG ARGS...: one rank per namespace, logs in $DIR/TAG.K.log
start_ranks() {
    local tag=$1 k
    shift
    PIDS=()
    for ((k = 0; k < NRANKS; k++)); do
        ip netns exec "$NSP-$k" env RANK="$k" LOCAL_RANK=0 WORLD_SIZE="$NRANKS" \
            LOCAL_WORLD_SIZE=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=$PORT \
            TORCHELASTIC_USE_AGENT_STORE=False C10D_SOCKET_IFNAME="${IFP}v${k}" \
            "$CHAOS" rank --timeout-ms "$T_MS" "$@" >"$DIR/$tag.$k.log" 2>&1 &
        PIDS+=($!)
    done
}

# wait_ready TAG: every rank printed "ready" (bounded)
wait_ready() {
    local tag=$1 k n deadline
    deadline=$(($(now_ms) + 30000))
    while [ "$(now_ms)" -lt "$deadline" ]; do
        n=0
        for ((k = 0; k < NRANKS; k++)); do
            grep -q ': ready' "$DIR/$tag.$k.log" 2>/dev/null && n=$((n + 1))
        done
        [ "$n" = "$NRANKS" ] && return 0
        for k in "${!PIDS[@]}"; do
            is_running "${PIDS[$k]}" || {
                log "  rank $k exited during init"
                return 1
            }
        done
        sleep 0.05
    done
    log "  not every rank ready within 30 s"
    return 1
}

# wait_exits DEADLINE_MS: fills CODES[k] and EXIT_MS[k]; "hang" if still running
wait_exits() {
    local deadline=$1 k left
    CODES=()
    EXIT_MS=()
    for ((k = 0; k < NRANKS; k++)); do
        CODES[k]=running
    done
    while :; do
        left=0
        for ((k = 0; k < NRANKS; k++)); do
            [ "${CODES[k]}" = running ] || continue
            if is_running "${PIDS[$k]}"; then
                left=$((left + 1))
            else
                EXIT_MS[k]=$(now_ms)
                wait "${PIDS[$k]}"
                CODES[k]=$?
            fi
        done
        [ "$left" = 0 ] && break
        if [ "$(now_ms)" -gt "$deadline" ]; then
            for ((k = 0; k < NRANKS; k++)); do
                [ "${CODES[k]}" = running ] && CODES[k]=hang
            done
            break
        fi
        sleep 0.01
    done
    for k in "${!PIDS[@]}"; do
        kill -KILL "${PIDS[$k]}" 2>/dev/null
        wait "${PIDS[$k]}" 2>/dev/null
    done
    PIDS=()
}

fail() {
    log "  FAIL: $*"
    FAILS=$((FAILS + 1))
}

show_logs() {
    local tag=$1 k
    for ((k = 0; k < NRANKS; k++)); do
        log "  --- $tag rank $k:"
        tail -n 5 "$DIR/$tag.$k.log" | sed 's/^/  | /'
    done
}

# --------------------------------------------- (a) a partition beyond T
long_partition() {
    local victim=$1 tag="long$1" k t_part line st err_ms worst=0 bad=0
    log "(a) rank $victim's link down for longer than T=${T_MS} ms"
    start_ranks "$tag" --seed 7
    if ! wait_ready "$tag"; then
        fail "(a) setup"
        show_logs "$tag"
        wait_exits 0
        return
    fi
    sleep 0.5 # the stream is running
    t_part=$(now_ms)
    ip -n "$NSP-$victim" link set "${IFP}v${victim}" down
    wait_exits $((t_part + HARD_MS))
    ip -n "$NSP-$victim" link set "${IFP}v${victim}" up
    for ((k = 0; k < NRANKS; k++)); do
        line=$(grep -m1 'ERRORED' "$DIR/$tag.$k.log")
        st=$(sed -n 's/.*status=\(C10D_[A-Z]*\).*/\1/p' <<<"$line")
        err_ms=$(sed -n 's/.*wall_ms=\([0-9]*\).*/\1/p' <<<"$line")
        if [ "${CODES[k]}" = hang ]; then
            log "  rank $k: HANG (still running ${HARD_MS} ms after the partition)"
            bad=1
            continue
        fi
        local ex=$((EXIT_MS[k] - t_part)) er=-1
        [ -n "$err_ms" ] && er=$((err_ms - t_part))
        [ "$ex" -gt "$worst" ] && worst=$ex
        log "  rank $k: exit ${CODES[k]} ${st:-no-status} errored after ${er} ms, exited after ${ex} ms"
        if [ "${CODES[k]}" != 10 ]; then
            bad=1
        elif [ "$st" != C10D_ETIMEDOUT ] && [ "$st" != C10D_ECLOSED ]; then
            bad=1
        elif [ "$ex" -gt "$BOUND_MS" ]; then
            log "  rank $k: over the bound (T + 2 s = ${BOUND_MS} ms)"
            bad=1
        fi
    done
    if [ "$bad" = 0 ]; then
        log "  PASS: every rank errored; the last exited ${worst} ms after the partition (bound ${BOUND_MS})"
    else
        fail "(a) partition of rank $victim"
        show_logs "$tag"
    fi
}

# ------------------------------------------- (b) a short partition heals
short_partition() {
    local victim=$1 tag="short$1" k t_part t_heal ops first_ops="" maxop worst_op=0 bad=0
    log "(b) rank $victim's link down for ${SHORT_MS} ms, then up"
    rm -f "$DIR/stop.$tag"
    start_ranks "$tag" --seed 11 --max-bytes 1048576 --stop-file "$DIR/stop.$tag"
    if ! wait_ready "$tag"; then
        fail "(b) setup"
        show_logs "$tag"
        wait_exits 0
        return
    fi
    sleep 0.5
    t_part=$(now_ms)
    ip -n "$NSP-$victim" link set "${IFP}v${victim}" down
    sleep "$(awk -v ms="$SHORT_MS" 'BEGIN { printf "%.3f", ms / 1000 }')"
    ip -n "$NSP-$victim" link set "${IFP}v${victim}" up
    t_heal=$(now_ms)
    # Ops go on after the heal; then every rank votes to stop at the same op.
    sleep 1.5
    for ((k = 0; k < NRANKS; k++)); do
        is_running "${PIDS[$k]}" || {
            log "  rank $k exited before the stop"
            bad=1
        }
    done
    : >"$DIR/stop.$tag"
    wait_exits $(($(now_ms) + HARD_MS))
    for ((k = 0; k < NRANKS; k++)); do
        line=$(grep -m1 -E 'DONE|ERRORED|WRONG' "$DIR/$tag.$k.log")
        ops=$(sed -n 's/.*DONE ops=\([0-9]*\).*/\1/p' <<<"$line")
        maxop=$(sed -n 's/.*max_op_ms=\([0-9]*\).*/\1/p' <<<"$line")
        log "  rank $k: exit ${CODES[k]} ${line#*: }"
        if [ "${CODES[k]}" != 0 ] || [ -z "$ops" ]; then
            bad=1
            continue
        fi
        [ -z "$first_ops" ] && first_ops=$ops
        [ "$ops" != "$first_ops" ] && bad=1
        [ "$maxop" -gt "$worst_op" ] && worst_op=$maxop
    done
    # The partition must have caught ops in flight, or (b) proved nothing.
    if [ "$bad" = 0 ] && [ "$worst_op" -lt $((SHORT_MS / 2)) ]; then
        log "  the longest op took ${worst_op} ms: the partition did not stall the stream"
        bad=1
    fi
    if [ "$bad" = 0 ]; then
        log "  PASS: ${first_ops} ops done and verified on every rank; partition $((t_heal - t_part)) ms, longest op ${worst_op} ms"
    else
        fail "(b) short partition of rank $victim"
        show_logs "$tag"
    fi
}

long_partition $((NRANKS - 1))
long_partition 0
short_partition 1

if [ "$FAILS" -ne 0 ]; then
    log "netns_test: $FAILS case(s) failed"
    exit 1
fi
log "netns_test: all cases passed"
exit 0
