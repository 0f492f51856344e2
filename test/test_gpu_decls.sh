#!/bin/sh
# test_gpu_decls: libc10d declares what it uses of CUDA and NCCL itself
# (gpu/gpu_decls.h), so that it builds without them; this checks
# those declarations against the real headers wherever they are installed.
# The check is compiled here, when the test runs, so that a build without
# the headers still configures and builds; without them it is skipped (77).
#
#   test_gpu_decls.sh CC CUDA_ROOT SOURCE_DIR WORK_DIR
# nccl.h is looked for in CUDA_ROOT/include, then in $NCCL_HOME/include.
set -u
cc=${1:?usage: test_gpu_decls.sh CC CUDA_ROOT SOURCE_DIR WORK_DIR}
root=${2:?cuda root}
src=${3:?source dir}
work=${4:?work dir}

cuda_inc=$root/include
nccl_inc=$root/include
if [ ! -f "$nccl_inc/nccl.h" ] && [ -n "${NCCL_HOME:-}" ]; then
    nccl_inc=$NCCL_HOME/include
fi
if [ ! -f "$cuda_inc/cuda_runtime_api.h" ] || [ ! -f "$nccl_inc/nccl.h" ]; then
    echo "SKIP: no cuda_runtime_api.h in $cuda_inc or no nccl.h in $nccl_inc (C10D_CUDA_ROOT=$root)"
    exit 77
fi

mkdir -p "$work" || exit 1
echo "checking gpu/gpu_decls.h against $cuda_inc/cuda_runtime_api.h and $nccl_inc/nccl.h"
# -isystem: the real headers are not ours to keep warning-free.
"$cc" -std=c11 -Wall -Wextra -Werror -I"$src" -isystem "$cuda_inc" -isystem "$nccl_inc" \
    -o "$work/gpu_decls_check" "$src/test/gpu_decls_check.c" || {
    echo "FAIL: our declarations differ from the real headers (the errors above name each one)"
    exit 1
}
"$work/gpu_decls_check"
