#!/bin/sh
# A newer NCCL for the GPU proof, built here: NCCL 2.28.9 (PyTorch 2.11's
# wheel) refuses two ranks on one GPU; from 2.30.3 NCCL_MULTI_RANK_GPU_ENABLE=1
# allows it, so the multi-rank suite can run on a one-GPU machine.
#
#   bench/nccl_build.sh SRC [ARCH]   SRC: a checkout of NVIDIA/nccl (2.30.3+);
#       ARCH: the GPU's compute capability without the dot (default 90: H100,
#       H200). Prints the library's path; carry it with
#       C10D_BUNDLE_NCCL=PATH bench/gpu_proof.sh bundle BUILD
#
# Kept small and quick to build (the whole carried tree must stay under
# 64 MiB): one architecture, and only the Ring algorithm with the Simple
# protocol (every op and dtype of the suite, NCCL_ALGO=Ring NCCL_PROTO=Simple
# at run time, which gpu_proof.sh sets with it).
set -eu
src=$(cd "${1:?usage: nccl_build.sh SRC [ARCH]}" && pwd)
arch=${2:-90}
cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
jobs=$(nproc)
t0=$(date +%s)
# A CUDA tree that ships its own nccl.h (as /usr/local/cuda here does, with
# NCCL 2.28.9) puts it ahead of the one being built: build against a view of
# that tree without NCCL's headers.
if [ -e "$cuda/include/nccl.h" ]; then
    view=$(mktemp -d)
    trap 'rm -rf "$view"' EXIT
    for e in "$cuda"/*; do ln -s "$e" "$view/"; done
    rm "$view/include"
    mkdir "$view/include"
    for e in "$cuda"/include/*; do
        case "$(basename "$e")" in nccl*) ;; *) ln -s "$e" "$view/include/" ;; esac
    done
    cuda=$view
fi
make -C "$src" -j"$jobs" src.build CUDA_HOME="$cuda" \
    NVCC_GENCODE="-gencode=arch=compute_${arch},code=sm_${arch}" \
    ONLY_FUNCS="AllReduce * * RING SIMPLE|AllGather RING SIMPLE|Broadcast RING SIMPLE|Reduce * * RING SIMPLE|ReduceScatter * * RING SIMPLE|SendRecv" >&2
lib=$(readlink -f "$src/build/lib/libnccl.so.2")
strip --strip-unneeded "$lib" 2>/dev/null || true
echo "built in $(($(date +%s) - t0)) s on $jobs cores: $(du -h "$lib" | cut -f1) $lib" >&2
echo "$lib"
