# Sourced by op_cost_callgrind.sh and op_locked_callgrind.sh, with their
# arguments (BUILD_DIR [BYTES] [OPS]): a 2-rank c10d-bench of blocking
# all_reduces of BYTES, rank 0 under valgrind --tool=callgrind with the
# options given to callgrind_rank0, rank 1 at full speed. Leaves the profile
# in $out/cg.out and the ops it covers in $nops.
build=$1
bytes=${2:-4}
ops=${3:-10000}
warmup=100
nops=$((ops + warmup))
command -v valgrind >/dev/null || { echo "$(basename "$0"): valgrind not installed" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM

callgrind_rank0() { # extra valgrind options
    bench=$(realpath "$build/bench/c10d-bench")
    args="-o all_reduce -b $bytes -e $bytes -n $ops -w $warmup -z 1 -c 0"
    "$build/tools/c10drun/c10drun" -n 2 sh -c "if [ \$RANK = 0 ]; then exec valgrind \
--tool=callgrind $* --callgrind-out-file=$out/cg.out $bench $args; else exec $bench $args; fi" \
        >/dev/null 2>&1
}
