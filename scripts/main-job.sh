#!/bin/sh
# README command 1: build libc10d (Release) and run the main job, a 4-rank
# data-parallel training run on this machine with the embedded store.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DC10D_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"
if [ -x build/examples/ddp_tiny ]; then
    exec build/tools/c10drun/c10drun -n 4 build/examples/ddp_tiny "$@"
fi
exec build/examples/c10d_engine_demo "$@"
