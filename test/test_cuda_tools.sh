#!/bin/sh
# The tools with --device cuda, 2 ranks under c10drun, on the CUDA runtime and
# NCCL the environment names (in ctest: the CPU simulation, test/gpusim, with
# one device per rank).
#
#   test_cuda_tools.sh C10DRUN bench BENCH [ARGS...]  the data check passes (-c 1)
#   test_cuda_tools.sh C10DRUN tcp BENCH [ARGS...]    the same on tcp with CUDA buffers
#   test_cuda_tools.sh C10DRUN missing BENCH          NCCL is not there: fails, naming the file
#   test_cuda_tools.sh C10DRUN ddp DDP_TINY [ARGS...] trains; both ranks end with the same weights
#
# c10drun bounds each job (--timeout) and stops every rank, and what a rank
# started, when one fails or time runs out, so nothing outlives the test.
set -u
run=${1:?usage: test_cuda_tools.sh C10DRUN bench|tcp|missing|ddp PROGRAM [ARGS...]}
mode=${2:?mode}
prog=${3:?program}
shift 3
out=$(mktemp "${TMPDIR:-/tmp}/test_cuda_tools.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT

job() {
    "$run" --timeout 60 --grace-ms 2000 -n 2 "$@" >"$out" 2>&1
    rc=$?
    cat "$out"
}

fail() {
    echo "FAIL: $*"
    exit 1
}

# has TEXT: the job's output holds TEXT (fixed string).
has() { grep -qF -- "$1" "$out"; }

case $mode in
bench)
    job "$prog" --backend nccl --device cuda -c 1 "$@"
    [ "$rc" = 0 ] || fail "c10d-bench exited with status $rc"
    has "backend nccl, device cuda" || fail "no header naming backend nccl, device cuda"
    has "check 1" || fail "the data check did not run"
    has "# Out of bounds values : 0 OK" || fail "the data check did not pass"
    ;;
tcp)
    # CUDA buffers on the tcp backend, staged through host memory.
    job "$prog" --backend tcp --device cuda -c 1 "$@"
    [ "$rc" = 0 ] || fail "c10d-bench exited with status $rc"
    has "backend tcp, device cuda" || fail "no header naming backend tcp, device cuda"
    has "# Out of bounds values : 0 OK" || fail "the data check did not pass"
    ;;
missing)
    lib=/nonexistent/libnccl.so.2
    export C10D_NCCL_LIBRARY=$lib
    job "$prog" --backend nccl --device cuda -c 1 -b 4 -e 4
    [ "$rc" != 0 ] || fail "c10d-bench succeeded without NCCL"
    [ "$rc" != 124 ] || fail "c10d-bench ran out of time instead of failing"
    has "NCCL could not be loaded ($lib" || fail "no message naming $lib"
    ;;
ddp)
    job "$prog" --device cuda "$@"
    [ "$rc" = 0 ] || fail "ddp_tiny exited with status $rc"
    has "weights identical on all 2 ranks" || fail "the ranks' weights differ"
    ;;
*)
    fail "unknown mode $mode"
    ;;
esac
echo "ok: $mode"
