#!/bin/sh
# The nccl backend and CUDA buffers on tcp on a real GPU: what no CPU-only
# run can show, in one unattended call of bounded length.
#
#   bench/gpu_proof.sh bundle BUILD                here: copy the shared
#       libraries the GPU machine lacks (libuv, jansson, cmocka) into
#       BUILD/gpu-libs, failing if a program the run needs is not built;
#       with C10D_BUNDLE_NCCL=PATH also that libnccl.so.2 (a 2.30.3+ NCCL
#       built here, bench/nccl_build.sh) into BUILD/gpu-libs/nccl
#   bench/gpu_proof.sh run BUILD OUT [BUDGET_S]    there: the steps below,
#       all within BUDGET_S seconds (default 420)
#
# Every step runs under `timeout -k` with the smaller of its own cap and what
# is left of the budget (a step that cannot get 10 s is skipped, saying so);
# its output is appended, line-buffered, to one log under OUT as it goes, so
# a killed step keeps what it printed. OUT/summary.txt gets one line per step
# (rc, seconds, timed out); the exit status is 0 only if every step passed.
# At most 8 files land in OUT, none above 16 MiB.
#
# `run` loads the NCCL of PyTorch's nvidia-nccl wheel (the one torch uses, so
# both sides of a comparison load the same library), or the bundled one if
# there is one (built with Ring/Simple kernels only, so NCCL_ALGO=Ring and
# NCCL_PROTO=Simple are set with it), and the CUDA runtime of the
# nvidia-cuda-runtime wheel or /usr/local/cuda; C10D_NCCL_LIBRARY and
# C10D_CUDART_LIBRARY, when set, win (the CPU simulation for a dry run).
#   smoke      the bundle's ldd, the GPU, one 1-rank all_reduce through raw
#              NCCL and through libc10d
#   test_nccl  the suite against the real libraries: its 1-GPU subset
#              (C10D_TEST_MAX_RANKS=1) unless this NCCL allows several ranks
#              on one GPU (2.30.3+) or there are 3 GPUs
#   host_cost  host cost per op, 1000 back-to-back 4 B in-place all_reduces
#              on ONE rank: raw NCCL vs libc10d vs torch.distributed, then
#              libc10d nonblocking and with the NaN check. A 1-rank floor of
#              the host's share, not the cost of a multi-rank op
#   sweep      c10d-bench nccl, 1 rank, 4 B - 256 MiB: NCCL runs a 1-rank
#              all_reduce as a device copy, so the time is a copy's and the
#              bus bandwidth is 0 by definition
#   tcp_cuda   CUDA buffers on tcp, 2 and 4 processes sharing the GPU,
#              against host buffers and torch gloo with CUDA tensors
set -u
usage="usage: gpu_proof.sh bundle BUILD | run BUILD OUT [BUDGET_S]"
mode=${1:?$usage}
build=$(cd "${2:?$usage}" && pwd) || exit 2
here=$(cd "$(dirname "$0")" && pwd)
programs="test/test_nccl bench/c10d-bench bench/bench_nccl_host tools/c10drun/c10drun"

if [ "$mode" = machine ]; then # the machine step of `run`, in a process a timeout can stop
    echo "# $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "C10D_NCCL_LIBRARY=${C10D_NCCL_LIBRARY:-<default>}"
    echo "C10D_CUDART_LIBRARY=${C10D_CUDART_LIBRARY:-<default>}"
    ${PYTHON:-python3} -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
    for p in $programs; do
        missing=$(ldd "$build/$p" | grep 'not found')
        [ -z "$missing" ] || { echo "$p lacks: $missing"; exit 1; }
    done
    echo "bundle: every program finds its libraries"
    exit 0
fi

if [ "$mode" = bundle ]; then
    mkdir -p "$build/gpu-libs"
    for p in $programs; do
        [ -x "$build/$p" ] || {
            echo "gpu_proof.sh: $build/$p is not built (configure with tests and benchmarks)" >&2
            exit 1
        }
        ldd "$build/$p" | awk '/libuv|libjansson|libcmocka/ {print $3}'
    done | sort -u | while read -r lib; do
        cp -L "$lib" "$build/gpu-libs/"
    done
    if [ -n "${C10D_BUNDLE_NCCL:-}" ]; then
        mkdir -p "$build/gpu-libs/nccl"
        cp -L "$C10D_BUNDLE_NCCL" "$build/gpu-libs/nccl/libnccl.so.2" || exit 1
    fi
    ls -lR "$build/gpu-libs"
    exit 0
fi
[ "$mode" = run ] || { echo "gpu_proof.sh: unknown mode $mode; $usage" >&2; exit 2; }
mkdir -p "${3:?$usage}" && out=$(cd "$3" && pwd) || exit 2
budget=${4:-420}
case "$budget" in '' | *[!0-9]*) echo "gpu_proof.sh: BUDGET_S must be seconds" >&2; exit 2 ;; esac
t_start=$(date +%s)
t_end=$((t_start + budget))
export LD_LIBRARY_PATH="$build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
run_tool="$build/tools/c10drun/c10drun"
status=0
summary="$out/summary.txt"
: >"$summary"
limit=16777216

# step NAME LOG CAP CMD...: CMD under the smaller of CAP and the budget left
# (5 s kept for the rest), output appended to OUT/LOG line by line.
step() {
    name=$1 log="$out/$2" cap=$3
    shift 3
    left=$((t_end - $(date +%s) - 5))
    [ "$cap" -gt "$left" ] && cap=$left
    if [ "$cap" -lt 10 ]; then
        line="$name: skipped, $((left + 5)) s of the ${budget} s budget left"
        echo "$line" | tee -a "$summary" "$log"
        status=1
        return 0
    fi
    echo "== $name (cap ${cap} s): $*" >>"$log"
    t0=$(date +%s)
    timeout -k 5 "$cap" stdbuf -oL -eL "$@" >>"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - t0))
    timed_out=no
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && timed_out=yes
    [ $rc -eq 0 ] || status=1
    line="$name: rc $rc, ${took} s, timed out: $timed_out"
    echo "$line" | tee -a "$summary"
    echo "== $line" >>"$log"
    if [ "$(stat -c %s "$log")" -gt $limit ]; then
        truncate -s $((limit - 4096)) "$log"
        echo "== truncated at 16 MiB" >>"$log"
    fi
}

wheel_lib() { # module, file
    $py -c "import $1, os, sys
for d in $1.__path__:
    p = os.path.join(d, 'lib', '$2')
    if os.path.exists(p): print(p); sys.exit(0)
sys.exit(1)" 2>/dev/null
}
# The library torch itself mapped, where the wheels' layout is another one.
torch_lib() { # name part
    $py -c "import torch; torch.cuda.nccl.version()
print(next(l.split()[-1] for l in open('/proc/self/maps') if '$1' in l))" 2>/dev/null
}
if [ -z "${C10D_NCCL_LIBRARY:-}" ] && [ -e "$build/gpu-libs/nccl/libnccl.so.2" ]; then
    export C10D_NCCL_LIBRARY="$build/gpu-libs/nccl/libnccl.so.2" NCCL_ALGO=Ring NCCL_PROTO=Simple
fi
if [ -z "${C10D_NCCL_LIBRARY:-}" ]; then
    nccl=$(wheel_lib nvidia.nccl libnccl.so.2) || nccl=$(wheel_lib nvidia.cu13 libnccl.so.2) ||
        nccl=$(torch_lib libnccl.so) || nccl=""
    [ -n "$nccl" ] && export C10D_NCCL_LIBRARY="$nccl"
fi
if [ -z "${C10D_CUDART_LIBRARY:-}" ]; then
    cudart=$(wheel_lib nvidia.cuda_runtime libcudart.so.13) ||
        cudart=$(wheel_lib nvidia.cu13 libcudart.so.13) || cudart=$(torch_lib libcudart.so) || cudart=""
    [ -n "$cudart" ] || for f in /usr/local/cuda/lib64/libcudart.so.13 /usr/local/cuda/lib64/libcudart.so.12; do
        [ -e "$f" ] && cudart=$f && break
    done
    [ -n "$cudart" ] && export C10D_CUDART_LIBRARY="$cudart"
fi

step machine smoke.log 60 sh "$0" machine "$build"
step smoke smoke.log 60 "$build/bench/bench_nccl_host" -n 10 -r 1 -b 4

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nccl_version=$(sed -n 's/.*loaded: nccl \([0-9][0-9.]*\).*/\1/p' "$out/smoke.log" | head -1)
max_ranks=1
[ "${gpus:-0}" -ge 3 ] && max_ranks=3
case "$nccl_version" in
2.3[1-9].* | 2.[4-9][0-9].* | 2.30.[3-9]*)
    export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_MAX_CTAS=1 NCCL_NVLS_ENABLE=0
    max_ranks=3
    ;;
esac
echo "GPUs: $gpus, NCCL loaded: ${nccl_version:-unknown}, ranks per test <= $max_ranks" |
    tee -a "$summary"

step test_nccl test_nccl.log 150 env C10D_TEST_MAX_RANKS=$max_ranks NCCL_DEBUG=WARN \
    "$build/test/test_nccl"

step host_cost host_cost.log 40 "$build/bench/bench_nccl_host" -n 1000 -r 11 -b 4
step host_cost_torch host_cost.log 40 $py "$here/nccl_host_torch.py" -n 1000 -r 11 -b 4
step host_cost_nonblocking host_cost.log 20 env C10D_NCCL_NONBLOCKING=1 \
    "$build/bench/bench_nccl_host" -m c10d -n 1000 -r 11 -b 4
step host_cost_timing host_cost.log 20 env C10D_NCCL_ENABLE_TIMING=1 \
    "$build/bench/bench_nccl_host" -m c10d -n 1000 -r 11 -b 4
step host_cost_nan_check host_cost.log 20 env C10D_NCCL_NAN_CHECK=1 \
    "$build/bench/bench_nccl_host" -m c10d -n 1000 -r 11 -b 4
step nan_check_1MiB host_cost.log 20 env C10D_NCCL_NAN_CHECK=1 \
    "$build/bench/bench_nccl_host" -m c10d -n 200 -r 5 -b 1048576

step sweep sweep.log 40 "$run_tool" --timeout 35 -n 1 "$build/bench/c10d-bench" \
    --backend nccl --device cuda -o all_reduce -b 4 -e 256M -f 4 -c 1

# Staging keeps 1 GiB pinned per group, so 256 MiB out of place does not re-pin.
export C10D_TCP_CUDA_STAGING_MAX=1073741824
for n in 2 4; do
    [ $n = 2 ] && top=256M || top=64M
    for dev in cuda cpu; do
        step "tcp_${dev}_$n" tcp_cuda.log 35 "$run_tool" --timeout 30 -n $n --no-prefix \
            "$build/bench/c10d-bench" --backend tcp --device $dev -o all_reduce -b 4K -e $top \
            -f 4 -z 1 -c 1 -n 20 -w 5
    done
    step "gloo_cuda_$n" tcp_cuda.log 45 "$run_tool" --timeout 40 -n $n --no-prefix \
        $py "$here/gloo_cuda_torch.py" -b 4K -e $top -f 4 -n 20 -w 5
done
# Processes sharing one GPU time-slice it; CUDA MPS (root can start it) lets
# their small copies run at once: the same 2-rank sweeps under MPS.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/c10d-mps CUDA_MPS_LOG_DIRECTORY=/tmp/c10d-mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    step mps_start tcp_cuda.log 15 nvidia-cuda-mps-control -d
    step tcp_cuda_2_mps tcp_cuda.log 35 "$run_tool" --timeout 30 -n 2 --no-prefix \
        "$build/bench/c10d-bench" --backend tcp --device cuda -o all_reduce -b 4K -e 256M \
        -f 4 -z 1 -c 1 -n 20 -w 5
    step gloo_cuda_2_mps tcp_cuda.log 45 "$run_tool" --timeout 40 -n 2 --no-prefix \
        $py "$here/gloo_cuda_torch.py" -b 4K -e 256M -f 4 -n 20 -w 5
    # Stopped whatever the budget says: a daemon must not outlive the run.
    echo quit | timeout -k 2 10 nvidia-cuda-mps-control >>"$out/tcp_cuda.log" 2>&1
    echo "mps_stop: rc $?" | tee -a "$summary"
fi
echo "total: $(($(date +%s) - t_start)) s of ${budget} s, status $status" | tee -a "$summary"
exit $status
