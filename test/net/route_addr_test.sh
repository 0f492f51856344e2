#!/usr/bin/env bash
# Real-network shapes the tcp backend and rendezvous must survive, built from
# network namespaces (one per "node") joined by a veth pair; the
# namespaces' hosts files are the only name service:
#
#   (a) Debian's /etc/hosts: each node's own hostname (set with unshare --uts)
#       maps to 127.0.1.1; MASTER_ADDR is node A's real address; two ranks
#       per node. A rank that publishes its hostname's address publishes
#       127.0.1.1, which the other node cannot reach.
#   (b) late DNS: MASTER_ADDR is a name (job-master-0) that neither node
#       resolves at start; the script adds it to both nodes' hosts files
#       after LATE_S seconds (glibc reads /etc/hosts on every lookup). Rank 0
#       must keep trying instead of failing at once.
#   (c) a PyTorchJob's pods: exactly the variables the training operator
#       gives (MASTER_ADDR = the master's headless service name, MASTER_PORT,
#       RANK, WORLD_SIZE, PET_*; no LOCAL_RANK), one process per node, each
#       node's hostname mapped to its pod address as the kubelet does;
#   (d) a ClusterIP-style store: c10d-store serve as its own process on node
#       B, reached at a virtual address that iptables DNATs (OUTPUT chain, in
#       both nodes) to the real one; ranks use TORCHELASTIC_USE_AGENT_STORE;
#   (e) MASTER_ADDR is node A's hostname, which node A maps to 127.0.1.1
#       and node B to A's address (a batch script's first node): rank 0
#       reaches its own store over loopback, yet must publish A's address.
#
# Every case runs build/examples/ddp_tiny and must end with every rank's
# exit status 0 (rank 0 prints "weights identical") within CASE_S seconds;
# every case also checks which address each rank listened on (the INFO line
# of the tcp backend).
#
# usage: route_addr_test.sh PATH/TO/ddp_tiny PATH/TO/c10d-store
# env: CASE_S (60), LATE_S (3), STEPS (20), CASES ("a b c d e"), KEEP_LOGS=1
# Exit: 0 pass, 1 fail, 77 skipped (not root, no namespaces/veth/unshare).
set -u

DDP=${1:?usage: route_addr_test.sh PATH/TO/ddp_tiny PATH/TO/c10d-store}
STORE_EXE=${2:?usage: route_addr_test.sh PATH/TO/ddp_tiny PATH/TO/c10d-store}
CASE_S=${CASE_S:-60}
LATE_S=${LATE_S:-3}
STEPS=${STEPS:-20}
CASES=${CASES:-a b c d e}

# Names unique per run (parallel runs never collide); interface names stay
# under the kernel's 15 characters. Each namespace has a network stack of its
# own, so fixed addresses and ports inside them are free by construction.
NSA="c10dnet-$$-a"
NSB="c10dnet-$$-b"
IFA="cn$$a"
IFB="cn$$b"
NET=10.88.0
ADDR_A=$NET.1
ADDR_B=$NET.2
VIP=10.96.0.10
PORT=29500
STORE_PORT=29600
DIR=$(mktemp -d /tmp/c10d_net.XXXXXX)
PIDS=()    # the job's processes, each leading its own process group
SERVERS=() # c10d-store processes, the same
NSS=()
FAILS=0
MADE_ETC_NETNS=0

log() { printf '%s\n' "$*"; }

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local p
    # Each rank leads its own process group (setsid): kill the group.
    for p in "${PIDS[@]}" "${SERVERS[@]}"; do
        kill -KILL -- "-$p" 2>/dev/null
    done
    for p in "${PIDS[@]}" "${SERVERS[@]}"; do
        wait "$p" 2>/dev/null
    done
    PIDS=()
    SERVERS=()
    # Deleting a namespace destroys its veth end and its iptables rules.
    for p in "${NSS[@]}"; do
        ip netns del "$p" 2>/dev/null
        rm -rf "/etc/netns/$p"
    done
    NSS=()
    if [ "$MADE_ETC_NETNS" = 1 ]; then
        rmdir /etc/netns 2>/dev/null # left if another run uses it
    fi
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

fail() {
    log "  FAIL: $*"
    FAILS=$((FAILS + 1))
}

now_ms() {
    local t=${EPOCHREALTIME/./}
    echo $((t / 1000))
}

[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no ip (iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no unshare (util-linux)"
command -v setsid >/dev/null 2>&1 || skip "no setsid (util-linux)"
for exe in "$DDP" "$STORE_EXE"; do
    [ -x "$exe" ] || {
        log "FAIL: $exe is not executable"
        exit 1
    }
done

# ------------------------------------------------------------------ setup
ip netns add "$NSA" 2>/dev/null || skip "cannot create a network namespace (ip netns add)"
NSS+=("$NSA")
ip netns add "$NSB" || skip "cannot create namespace $NSB"
NSS+=("$NSB")
ip link add "$IFA" type veth peer name "$IFB" 2>/dev/null || skip "no veth support"
ip link set "$IFA" netns "$NSA" || skip "cannot move a veth into $NSA"
ip link set "$IFB" netns "$NSB" || skip "cannot move a veth into $NSB"
ip -n "$NSA" link set lo up
ip -n "$NSB" link set lo up
ip -n "$NSA" addr add "$ADDR_A/24" dev "$IFA"
ip -n "$NSB" addr add "$ADDR_B/24" dev "$IFB"
ip -n "$NSA" link set "$IFA" up
ip -n "$NSB" link set "$IFB" up
# A default route, as a pod has: the virtual address of (d) is routed out of
# the veth, and DNAT then rewrites it.
ip -n "$NSA" route add default dev "$IFA"
ip -n "$NSB" route add default dev "$IFB"
[ -d /etc/netns ] || MADE_ETC_NETNS=1
mkdir -p "/etc/netns/$NSA" "/etc/netns/$NSB"
# Names come from the hosts files only: the host's DNS server is not
# reachable from the namespaces, and a lookup that waits for its timeouts
# would hide what a missing name does (a cluster DNS answers NXDOMAIN at
# once). A nameserver on the namespace's loopback refuses at once as well.
for ns in "$NSA" "$NSB"; do
    if [ -r /etc/nsswitch.conf ]; then
        sed 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf >"/etc/netns/$ns/nsswitch.conf"
    fi
    echo "nameserver 127.0.0.1" >"/etc/netns/$ns/resolv.conf"
done
ip netns exec "$NSA" unshare --uts sh -c 'hostname nodea' 2>/dev/null ||
    skip "cannot run unshare --uts inside a namespace"
ok=0
for _ in $(seq 50); do
    if ip netns exec "$NSB" timeout 1 bash -c "exec 3<>/dev/tcp/$ADDR_A/9" 2>&1 |
        grep -q -i refused; then
        ok=1
        break
    fi
    sleep 0.1
done
[ "$ok" = 1 ] || skip "namespace B cannot reach $ADDR_A over the veth pair"
log "net: nodes $NSA ($ADDR_A) and $NSB ($ADDR_B), ${CASE_S} s per case"

# hosts NS LINES...: the namespace's /etc/hosts (ip netns exec bind-mounts
# /etc/netns/NS/hosts over /etc/hosts). Written in place, never replaced, so
# a namespace that is running keeps seeing the same file.
hosts() {
    local ns=$1
    shift
    printf '%s\n' "127.0.0.1 localhost" "$@" >"/etc/netns/$ns/hosts"
}

# start_rank TAG NS HOSTNAME K ENV...: one process of the job in namespace NS
# with its own hostname, the given environment only (env -i), log
# $DIR/TAG.K.log. The process leads its own group (setsid) so cleanup can
# end it and anything it started.
start_rank() {
    local tag=$1 ns=$2 host=$3 k=$4
    shift 4
    # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
    setsid ip netns exec "$ns" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "$host" \
        env -i PATH="$PATH" C10D_LOG_LEVEL=INFO "$@" \
        timeout -s KILL "$CASE_S" "$DDP" "$STEPS" >"$DIR/$tag.$k.log" 2>&1 &
    PIDS+=($!)
}

# wait_ranks TAG: waits for every started rank (each bounded by its own
# timeout), fills CODES[k]; returns 1 unless all exited 0.
wait_ranks() {
    local tag=$1 k bad=0
    CODES=()
    for k in "${!PIDS[@]}"; do
        wait "${PIDS[$k]}"
        CODES[k]=$?
        [ "${CODES[k]}" = 0 ] || bad=1
    done
    PIDS=()
    return $bad
}

show_logs() {
    local tag=$1 f
    for f in "$DIR/$tag".*.log; do
        log "  --- $(basename "$f"):"
        grep -v ' I ' "$f" | tail -n 6 | sed 's/^/  | /'
    done
}

# published TAG K: the address rank K's tcp backend listened on ("" if none)
published() {
    sed -n 's/.* tcp: listening on \([^ ]*\) .*/\1/p' "$DIR/$1.$2.log" | head -n 1
}

# check_published TAG K ADDR: rank K listened on ADDR (any port)
check_published() {
    local got
    got=$(published "$1" "$2")
    case "$got" in
    "$3":*) ;;
    *)
        log "  rank $2 listened on '${got:-nothing}', expected $3"
        return 1
        ;;
    esac
}

# finish TAG NAME T0 [rank:addr...]: the verdict of one case.
finish() {
    local tag=$1 name=$2 t0=$3 bad=0 k pair
    shift 3
    wait_ranks "$tag" || bad=1
    local ms=$(($(now_ms) - t0))
    for k in "${!CODES[@]}"; do
        [ "${CODES[k]}" = 0 ] || log "  rank $k: exit ${CODES[k]}$([ "${CODES[k]}" = 137 ] && echo ' (killed at the case timeout)')"
    done
    grep -q "weights identical" "$DIR/$tag.0.log" 2>/dev/null || bad=1
    for pair in "$@"; do
        check_published "$tag" "${pair%%:*}" "${pair#*:}" || bad=1
    done
    if [ "$bad" = 0 ]; then
        log "  PASS: $name in ${ms} ms"
    else
        fail "$name (${ms} ms)"
        show_logs "$tag"
    fi
}

# ------------------------------- (a) hostnames that resolve to 127.0.1.1
case_debian_hosts() {
    local tag=debian t0
    log "(a) each node's hostname maps to 127.0.1.1; MASTER_ADDR=$ADDR_A; 2 ranks per node"
    hosts "$NSA" "127.0.1.1 nodea"
    hosts "$NSB" "127.0.1.1 nodeb"
    t0=$(now_ms)
    local k ns host
    for k in 0 1 2 3; do
        if [ "$k" -lt 2 ]; then ns=$NSA host=nodea; else ns=$NSB host=nodeb; fi
        start_rank "$tag" "$ns" "$host" "$k" RANK="$k" WORLD_SIZE=4 LOCAL_RANK=$((k % 2)) \
            LOCAL_WORLD_SIZE=2 MASTER_ADDR="$ADDR_A" MASTER_PORT="$PORT"
    done
    finish "$tag" "Debian-style hosts" "$t0" 0:"$ADDR_A" 1:"$ADDR_A" 2:"$ADDR_B" 3:"$ADDR_B"
}

# ---------- (e) MASTER_ADDR = node A's hostname, which A maps to 127.0.1.1
case_master_hostname() {
    local tag=mastername t0
    log "(e) MASTER_ADDR=nodea: 127.0.1.1 on node A itself, $ADDR_A on node B"
    hosts "$NSA" "127.0.1.1 nodea"
    hosts "$NSB" "127.0.1.1 nodeb" "$ADDR_A nodea"
    t0=$(now_ms)
    local k ns host
    for k in 0 1 2 3; do
        if [ "$k" -lt 2 ]; then ns=$NSA host=nodea; else ns=$NSB host=nodeb; fi
        start_rank "$tag" "$ns" "$host" "$k" RANK="$k" WORLD_SIZE=4 LOCAL_RANK=$((k % 2)) \
            LOCAL_WORLD_SIZE=2 MASTER_ADDR=nodea MASTER_PORT="$PORT"
    done
    finish "$tag" "master's hostname on loopback at home" "$t0" 0:"$ADDR_A" 1:"$ADDR_A" \
        2:"$ADDR_B" 3:"$ADDR_B"
}

# ------------------------------------------- (b) the master's name appears late
case_late_dns() {
    local tag=late t0
    log "(b) MASTER_ADDR=job-master-0 resolves nowhere until ${LATE_S} s after start"
    hosts "$NSA" "127.0.1.1 nodea"
    hosts "$NSB" "127.0.1.1 nodeb"
    t0=$(now_ms)
    local k ns host
    for k in 0 1; do
        if [ "$k" = 0 ]; then ns=$NSA host=nodea; else ns=$NSB host=nodeb; fi
        start_rank "$tag" "$ns" "$host" "$k" RANK="$k" WORLD_SIZE=2 LOCAL_RANK=0 \
            LOCAL_WORLD_SIZE=1 MASTER_ADDR=job-master-0 MASTER_PORT="$PORT"
    done
    sleep "$LATE_S" & # waited for so that a signal ends the run at once
    wait $!
    local alive=1
    kill -0 "${PIDS[0]}" 2>/dev/null || alive=0
    printf '%s\n' "$ADDR_A job-master-0" >>"/etc/netns/$NSA/hosts"
    printf '%s\n' "$ADDR_A job-master-0" >>"/etc/netns/$NSB/hosts"
    log "  job-master-0 -> $ADDR_A added after $(($(now_ms) - t0)) ms"
    finish "$tag" "late DNS" "$t0" 0:"$ADDR_A" 1:"$ADDR_B"
    if [ "$alive" = 0 ]; then
        fail "(b) rank 0 had exited before the name appeared"
    fi
    if ! grep -q "W store: .*job-master-0.*" "$DIR/$tag.0.log"; then
        fail "(b) rank 0 did not warn that job-master-0 does not resolve"
        show_logs "$tag"
    fi
}

# ---------------------------------------------------- (c) PyTorchJob pods
case_pytorchjob() {
    local tag=pytorchjob t0
    log "(c) PyTorchJob pods: MASTER_ADDR=job-master-0 (headless service), PET_*, no LOCAL_RANK"
    # The kubelet maps the pod's hostname to the pod's address; cluster DNS
    # answers the service name (here: the hosts file).
    hosts "$NSA" "$ADDR_A job-master-0"
    hosts "$NSB" "$ADDR_B job-worker-0" "$ADDR_A job-master-0"
    t0=$(now_ms)
    local k ns host
    for k in 0 1; do
        if [ "$k" = 0 ]; then ns=$NSA host=job-master-0; else ns=$NSB host=job-worker-0; fi
        start_rank "$tag" "$ns" "$host" "$k" MASTER_ADDR=job-master-0 MASTER_PORT=23456 \
            RANK="$k" WORLD_SIZE=2 PET_NPROC_PER_NODE=1 PET_NNODES=2 PET_NODE_RANK="$k" \
            PET_MASTER_ADDR=job-master-0 PET_MASTER_PORT=23456 PYTHONUNBUFFERED=1
    done
    finish "$tag" "PyTorchJob environment" "$t0" 0:"$ADDR_A" 1:"$ADDR_B"
}

# ------------------------------------- (d) a store behind a DNAT'ed address
case_cluster_ip() {
    local tag=clusterip t0
    log "(d) c10d-store on $ADDR_B:$STORE_PORT reached at $VIP:$PORT through DNAT; agent store"
    # iptables comes with scripts/install-deps.sh test; without it this case is skipped.
    if ! command -v iptables >/dev/null 2>&1; then
        log "  SKIP (d): no iptables (scripts/install-deps.sh test installs it)"
        return
    fi
    local ns
    for ns in "$NSA" "$NSB"; do
        if ! ip netns exec "$ns" iptables -t nat -A OUTPUT -d "$VIP" -p tcp --dport "$PORT" \
            -j DNAT --to-destination "$ADDR_B:$STORE_PORT" 2>"$DIR/iptables.log"; then
            log "  SKIP (d): iptables cannot add a DNAT rule: $(head -n 1 "$DIR/iptables.log")"
            return
        fi
    done
    hosts "$NSA" "$ADDR_A job-worker-0"
    hosts "$NSB" "$ADDR_B job-worker-1"
    setsid ip netns exec "$NSB" timeout -s KILL "$CASE_S" "$STORE_EXE" serve --host "$ADDR_B" \
        --port "$STORE_PORT" --port-file "$DIR/store.port" >"$DIR/$tag.store.log" 2>&1 &
    SERVERS+=($!)
    local _n
    for _n in $(seq 100); do
        [ -s "$DIR/store.port" ] && break
        sleep 0.05
    done
    t0=$(now_ms)
    local k host
    for k in 0 1; do
        if [ "$k" = 0 ]; then ns=$NSA host=job-worker-0; else ns=$NSB host=job-worker-1; fi
        start_rank "$tag" "$ns" "$host" "$k" MASTER_ADDR="$VIP" MASTER_PORT="$PORT" RANK="$k" \
            WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TORCHELASTIC_USE_AGENT_STORE=True
    done
    finish "$tag" "store behind DNAT" "$t0" 0:"$ADDR_A" 1:"$ADDR_B"
    kill -TERM -- "-${SERVERS[0]}" 2>/dev/null
    wait "${SERVERS[0]}" 2>/dev/null
    SERVERS=()
}

for c in $CASES; do
    case $c in
    a) case_debian_hosts ;;
    b) case_late_dns ;;
    c) case_pytorchjob ;;
    d) case_cluster_ip ;;
    e) case_master_hostname ;;
    *) log "unknown case '$c' (CASES: a b c d e)" && exit 1 ;;
    esac
done

if [ "$FAILS" -ne 0 ]; then
    log "route_addr_test: $FAILS case(s) failed"
    exit 1
fi
log "route_addr_test: all cases passed"
exit 0
