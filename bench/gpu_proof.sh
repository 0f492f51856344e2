#!/bin/sh
# The nccl backend on a real GPU: what no CPU-only run can show.
#
#   bench/gpu_proof.sh bundle BUILD        here: copy the shared libraries the
#                                          GPU machine lacks (libuv, jansson,
#                                          cmocka) into BUILD/gpu-libs
#   bench/gpu_proof.sh run BUILD [OUT]     there: the suite and the benchmarks,
#                                          logs in OUT (default ./gpu-proof)
#
# `run` loads the NCCL that PyTorch's nvidia-nccl wheel installed (the one
# torch uses, so both sides of the comparison load the same library), and
# the CUDA runtime of the nvidia-cuda-runtime wheel or /usr/local/cuda:
#   1. test_nccl against real CUDA + NCCL (C10D_TEST_MAX_RANKS=1 unless this
#      NCCL allows several ranks on one GPU, 2.30.3+, or there are more GPUs);
#   2. host cost per op, 1000 back-to-back 4 B in-place all_reduces on one
#      rank: raw NCCL vs libc10d (bench_nccl_host) vs torch.distributed
#      (nccl_host_torch.py);
#   3. c10d-bench --backend nccl --device cuda, all_reduce 4 B - 256 MiB, one rank;
#   4. CUDA buffers on tcp, 2 ranks on the one GPU, all_reduce 4 KiB - 256 MiB:
#      c10d-bench --backend tcp --device cuda, the same on host buffers (the
#      staging's cost), and torch gloo with CUDA tensors (gloo_cuda_torch.py).
#      test_nccl's tcp-cuda cases (2 and 3 ranks sharing the GPU) run in 1.
set -u
mode=${1:?usage: gpu_proof.sh bundle|run BUILD [OUT]}
build=${2:?build directory}
here=$(cd "$(dirname "$0")" && pwd)

if [ "$mode" = bundle ]; then
    mkdir -p "$build/gpu-libs"
    for exe in "$build/test/test_nccl" "$build/bench/c10d-bench" "$build/bench/bench_nccl_host"; do
        [ -x "$exe" ] || { echo "gpu_proof.sh: $exe is not built (configure with tests and benchmarks)" >&2; exit 1; }
        ldd "$exe" | awk '/libuv|libjansson|libcmocka/ {print $3}'
    done | sort -u | while read -r lib; do
        cp -L "$lib" "$build/gpu-libs/"
    done
    ls "$build/gpu-libs"
    exit 0
fi
[ "$mode" = run ] || { echo "gpu_proof.sh: unknown mode $mode" >&2; exit 2; }
out=${3:-gpu-proof}
mkdir -p "$out"
export LD_LIBRARY_PATH="$build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${PYTHON:-python3}

wheel_lib() { # module, file
    $py -c "import $1, os, sys
for d in $1.__path__:
    p = os.path.join(d, 'lib', '$2')
    if os.path.exists(p): print(p); sys.exit(0)
sys.exit(1)" 2>/dev/null
}
# Libraries named in the environment win; else torch's wheels; else the defaults.
if [ -z "${C10D_NCCL_LIBRARY:-}" ]; then
    nccl=$(wheel_lib nvidia.nccl libnccl.so.2) && export C10D_NCCL_LIBRARY="$nccl"
fi
if [ -z "${C10D_CUDART_LIBRARY:-}" ]; then
    cudart=$(wheel_lib nvidia.cuda_runtime libcudart.so.13) ||
        cudart=$(wheel_lib nvidia.cu13 libcudart.so.13) || cudart=""
    [ -n "$cudart" ] || for f in /usr/local/cuda/lib64/libcudart.so.13 /usr/local/cuda/lib64/libcudart.so.12; do
        [ -e "$f" ] && cudart=$f && break
    done
    [ -n "$cudart" ] && export C10D_CUDART_LIBRARY="$cudart"
fi
unset C10D_SIM_DEVICES

{
    echo "# $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    echo "C10D_NCCL_LIBRARY=${C10D_NCCL_LIBRARY:-<default>}"
    echo "C10D_CUDART_LIBRARY=${C10D_CUDART_LIBRARY:-<default>}"
    $py -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" 2>&1
} | tee "$out/machine.txt"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nccl_code=$("$build/bench/bench_nccl_host" -m raw -n 1 -r 1 2>/dev/null | sed -n 's/.*loaded: nccl \([0-9.]*\).*/\1/p')
echo "GPUs: $gpus, NCCL loaded: $nccl_code" | tee -a "$out/machine.txt"
max_ranks=1
[ "${gpus:-0}" -ge 3 ] && max_ranks=3
case "$nccl_code" in 2.3[0-9].* | 2.[4-9]*) export NCCL_MULTI_RANK_GPU_ENABLE=1 max_ranks=3 ;; esac

status=0
echo "== 1. test_nccl (ranks <= $max_ranks)"
C10D_TEST_MAX_RANKS=$max_ranks timeout 580 "$build/test/test_nccl" >"$out/test_nccl.log" 2>&1 || status=1
grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED) *\]|skipped' "$out/test_nccl.log"

echo "== 2. host cost per op (1 rank, 4 B in place, 1000 ops x 11 rounds)"
"$build/bench/bench_nccl_host" -n 1000 -r 11 -b 4 2>&1 | tee "$out/host_cost.txt" || status=1
$py "$here/nccl_host_torch.py" -n 1000 -r 11 -b 4 2>&1 | tee -a "$out/host_cost.txt" || status=1

echo "== 3. c10d-bench all_reduce 4 B - 256 MiB, 1 rank"
"$build/tools/c10drun/c10drun" --timeout 300 -n 1 "$build/bench/c10d-bench" --backend nccl \
    --device cuda -o all_reduce -b 4 -e 256M -f 4 -c 1 2>&1 | tee "$out/sweep.txt" || status=1
echo "== 4. CUDA buffers on tcp, 2 ranks on one GPU, all_reduce 4 KiB - 256 MiB"
for dev in cuda cpu; do
    "$build/tools/c10drun/c10drun" --timeout 300 -n 2 --no-prefix "$build/bench/c10d-bench" \
        --backend tcp --device $dev -o all_reduce -b 4K -e 256M -f 4 -z 1 -c 1 -n 20 -w 5 2>&1 |
        tee "$out/tcp_$dev.txt" || status=1
done
"$build/tools/c10drun/c10drun" --timeout 300 -n 2 --no-prefix $py "$here/gloo_cuda_torch.py" \
    -b 4K -e 256M -f 4 -n 20 -w 5 2>&1 | tee "$out/gloo_cuda_torch.txt" || status=1
exit $status
