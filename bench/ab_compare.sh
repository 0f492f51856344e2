#!/usr/bin/env bash
# Two builds of libc10d against each other, interleaved in one run on this
# machine, to show what a change costs: 2-rank all_reduce latency and busbw
# (c10d-bench -z 1, ranks bound to cores) and store ops/s (store_loadgen
# against each build's c10d-store, fresh server per run). Each row runs R
# times with the builds alternating and keeps each build's best run: on a
# shared machine a neighbour's burst only ever makes a run slower.
#
#   bench/ab_compare.sh BUILD_A BUILD_B [--repeat R]
#
# Builds nothing: each BUILD needs c10drun, c10d-bench, c10d-store and
# store_loadgen (cmake --build BUILD --target c10drun c10d-bench c10d-store store_loadgen).
set -u
[ $# -ge 2 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
A=$1 B=$2
shift 2
REPEAT=3
[ "${1:-}" = --repeat ] && REPEAT=$2
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT INT TERM

# all_reduce SIZE ITERS BUILD: "time_us busbw_gbs" of the slowest rank.
allreduce() {
    "$3/tools/c10drun/c10drun" -n 2 --bind-to core --no-prefix "$3/bench/c10d-bench" \
        -b "$1" -e "$1" -n "$2" -w $(($2 / 10 + 2)) -z 1 -c 0 2>/dev/null \
        | awk '$1 ~ /^[0-9]+$/ && NF >= 9 {print $6, $8}'
}

# store OPS PATTERN CONNS BUILD: ops/s.
store_ops() {
    local dir port pid line
    dir=$(mktemp -d)
    "$4/store_server/c10d-store" serve --host 127.0.0.1 --port 0 --port-file "$dir/port" \
        --stats-interval-s 0 >/dev/null 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 100); do [ -s "$dir/port" ] && break; sleep 0.05; done
    port=$(cat "$dir/port")
    line=$("$4/bench/store_loadgen" --port "$port" --dialect current --pattern "$2" \
        --conns "$3" --duration 2 2>/dev/null | grep RESULT)
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rm -rf "$dir"
    echo "$line" | tr ' ' '\n' | awk -F= '$1 == "ops_s" {print $2}'
}

best_min() { sort -g | head -1; }
best_max() { sort -g | tail -1; }

echo "A = $A ($(git -C "$(dirname "$0")/.." rev-parse --short HEAD 2>/dev/null) tree), B = $B; best of $REPEAT, builds interleaved"
printf '%-28s %12s %12s %8s\n' "case" "A" "B" "B/A"
for spec in "4096 2000" "65536 1000" "1048576 200" "16777216 20" "67108864 8"; do
    # shellcheck disable=SC2086 # word splitting on purpose
    set -- $spec
    ta=() tb=() ba=() bb=()
    for _ in $(seq "$REPEAT"); do
        read -r t bw < <(allreduce "$1" "$2" "$A"); ta+=("$t"); ba+=("$bw")
        read -r t bw < <(allreduce "$1" "$2" "$B"); tb+=("$t"); bb+=("$bw")
    done
    a=$(printf '%s\n' "${ta[@]}" | best_min) b=$(printf '%s\n' "${tb[@]}" | best_min)
    printf '%-28s %12s %12s %8.2f\n' "all_reduce $1 B time us" "$a" "$b" "$(echo "$b / $a" | bc -l)"
    a=$(printf '%s\n' "${ba[@]}" | best_max) b=$(printf '%s\n' "${bb[@]}" | best_max)
    printf '%-28s %12s %12s %8.2f\n' "all_reduce $1 B busbw GB/s" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
for spec in "set 1" "get 1" "set 256" "get 256" "wait 256"; do
    # shellcheck disable=SC2086 # word splitting on purpose
    set -- $spec
    ra=() rb=()
    for _ in $(seq "$REPEAT"); do
        ra+=("$(store_ops x "$1" "$2" "$A")")
        rb+=("$(store_ops x "$1" "$2" "$B")")
    done
    a=$(printf '%s\n' "${ra[@]}" | best_max) b=$(printf '%s\n' "${rb[@]}" | best_max)
    printf '%-28s %12s %12s %8.2f\n' "store $1 x$2 conns ops/s" "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
