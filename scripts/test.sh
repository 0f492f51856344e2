#!/bin/sh
# README command 2 (and .ci/run): build and run the whole ctest suite, then
# build and run it again under AddressSanitizer + UBSan.
#   scripts/test.sh            both builds
#   scripts/test.sh normal     only the normal build
#   scripts/test.sh asan       only the sanitizer build
#   scripts/test.sh tsan       the engine tests (the caller's lane, the locks, the group's
#                              argument races) under ThreadSanitizer
#
# The two builds see different machines. The normal one hides the CUDA
# toolkit (C10D_CUDA_ROOT points nowhere, nvcc is not used): the library,
# the nccl backend and its suite on the CPU simulation must build and pass
# with no CUDA header, as on a host without CUDA (test_gpu_decls skips
# there). The sanitizer build keeps the default CUDA root, so where CUDA
# and NCCL are installed test_gpu_decls checks libc10d's declarations of
# them against the real headers and nvcc builds the NaN check kernel.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
scripts/install-deps.sh launchers # mpirun, srun: test/launchers/
scripts/install-deps.sh container # buildah, debootstrap: test_container
jobs=$(nproc)
which=${1:-all}

run_suite() { # dir, cmake flags...
    dir=$1
    shift
    cmake -S . -B "$dir" "$@" >/dev/null
    cmake --build "$dir" -j"$jobs"
    # One test at a time: the multi-process tests start 2-8 ranks each, and two
    # of them sharing two cores made a rank overrun its deadline (docs/faults.md).
    (cd "$dir" && ctest --output-on-failure --timeout 900)
}

if [ "$which" = all ] || [ "$which" = normal ]; then
    echo "== normal build (Release), no CUDA toolkit =="
    run_suite build-test -DCMAKE_BUILD_TYPE=Release -DC10D_CUDA_ROOT=/nonexistent -DC10D_NVCC=OFF
fi
if [ "$which" = all ] || [ "$which" = asan ]; then
    echo "== AddressSanitizer + UBSan build =="
    # The image test builds the same Release image from the sources in both
    # passes; once (in the normal pass) proves it.
    C10D_TEST_CONTAINER=0 \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        run_suite build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DC10D_SANITIZE=address,undefined
fi
if [ "$which" = tsan ]; then
    echo "== ThreadSanitizer build (engine tests) =="
    cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DC10D_SANITIZE=thread >/dev/null
    cmake --build build-tsan -j"$jobs" --target test_work test_work_compose test_loop test_wait_lock test_engine_handoff test_backend_contract test_shm_lane test_p2p_lane test_p2p_lane_batch test_work_park test_lock test_block_cache test_flight_recorder test_pg_args test_pg_lifetime test_pg_ops test_pg_faults test_shm test_shm_in_place
    (cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -R 'test_(work|work_compose|loop|wait_lock|engine_handoff|backend_contract|shm_lane|p2p_lane|p2p_lane_batch|work_park|lock|block_cache|flight_recorder|pg_args|pg_lifetime|pg_ops|pg_faults|shm|shm_in_place)$')
fi
