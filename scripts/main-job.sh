#!/bin/sh
# README command 1: build libc10d (Release) and run the main job: 4 ranks on
# this machine (c10drun), rendezvous through rank 0's embedded store, training a
# tiny model data-parallel (examples/ddp_tiny.c).
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DC10D_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)"
exec build/tools/c10drun/c10drun -n 4 build/examples/ddp_tiny "$@"
