# Network namespaces as hosts, for the tests and benchmarks that need more than one (sourced;
# root only). Interface names: 15 characters at most, unique on this machine while they live.
#   netns_two NS_A NS_B                        both namespaces, loopback up
#   netns_link NS_A NS_B IF_A IF_B ADDR_A ADDR_B  a veth pair between them (ADDR with /prefix)
#   netns_gone NS...                           kills what runs in each, deletes it (its veth
#                                              pairs go with it)

netns_two() {
    ip netns add "$1" && ip netns add "$2" &&
        ip -n "$1" link set lo up && ip -n "$2" link set lo up
}

netns_link() {
    ip link add "$3" type veth peer name "$4" &&
        ip link set "$3" netns "$1" && ip link set "$4" netns "$2" &&
        ip -n "$1" addr add "$5" dev "$3" && ip -n "$2" addr add "$6" dev "$4" &&
        ip -n "$1" link set "$3" up && ip -n "$2" link set "$4" up
}

netns_gone() {
    local ns p
    for ns in "$@"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            kill -KILL "$p" 2>/dev/null
        done
        ip netns del "$ns" 2>/dev/null
    done
}
