#!/bin/sh
# ddp_tiny under Open MPI's real mpirun, with no variable set by hand:
# ranks come from OMPI_COMM_WORLD_*, rank 0's address through PMIx (MASTER_ADDR
# is unset on purpose); then a half-set environment and a missing libpmix,
# each one clear error at once.
#   mpirun_ddp.sh DDP_TINY
# Exit 77 (skip) when mpirun is not installed.
set -u
DDP=$1
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not installed (scripts/install-deps.sh launchers)"; exit 77; }
T=$(mktemp -d /tmp/c10d-mpirun.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$T/out"; exit 1; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

# Root may start ranks only when told; a 2-core machine runs 4 ranks only
# when oversubscribing is allowed.
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" -ne 0 ] || MPIRUN="$MPIRUN --allow-run-as-root"
# Nothing of another launcher may leak in from the caller.
for v in MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TORCHELASTIC_RUN_ID \
    SLURM_JOB_ID SLURM_STEP_ID SLURM_PROCID SLURM_NTASKS PMI_RANK PMI_SIZE; do
    unset "$v"
done

# The sanitizer build: libpmix leaks a few bytes of its own (pmix_rte_init,
# strdup'd values) that LeakSanitizer would report as the rank's.
printf 'leak:libpmix.so\n' >"$T/lsan.supp"
export LSAN_OPTIONS="suppressions=$T/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

t0=$(date +%s.%N)
C10D_LOG_LEVEL=INFO timeout 120 $MPIRUN -n 4 -x C10D_LOG_LEVEL "$DDP" >"$T/out" 2>&1
rc=$?
t1=$(date +%s.%N)
[ $rc -eq 0 ] || fail "mpirun -n 4 ddp_tiny exited $rc"
grep -q "weights identical on all 4 ranks" "$T/out" || fail "no identical-weights line"
n=$(grep -c "rank [0-3]/4 from Open MPI (OMPI_COMM_WORLD_\*), local rank [0-3]/4, master .* from PMIx" "$T/out")
[ "$n" -eq 4 ] || fail "expected 4 ranks saying 'from Open MPI ... from PMIx', got $n"
echo "ok: mpirun -n 4 ddp_tiny, master from PMIx, in $(secs "$t0" "$t1") s"

# A half-set environment: WORLD_SIZE by hand without RANK fails at once,
# naming what is missing, instead of waiting.
t0=$(date +%s.%N)
timeout 60 $MPIRUN -n 2 -x WORLD_SIZE=2 "$DDP" >"$T/out" 2>&1
rc=$?
t1=$(date +%s.%N)
[ $rc -ne 0 ] || fail "a half-set environment must fail"
[ $rc -ne 124 ] || fail "a half-set environment must fail at once, not time out"
grep -q "environment variable RANK, MASTER_ADDR, MASTER_PORT expected, but not set" "$T/out" ||
    fail "the error does not name RANK, MASTER_ADDR and MASTER_PORT"
echo "ok: half-set environment fails in $(secs "$t0" "$t1") s naming every missing variable"

# No PMIx library to load (as on a machine without libpmix): one clear error
# saying to set MASTER_ADDR and MASTER_PORT, at once.
t0=$(date +%s.%N)
timeout 60 $MPIRUN -n 2 -x C10D_PMIX_LIBRARY=/nonexistent/libpmix.so.2 "$DDP" >"$T/out" 2>&1
rc=$?
t1=$(date +%s.%N)
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "without libpmix mpirun must fail at once (exit $rc)"
grep -q "no PMIx library could be loaded.*set MASTER_ADDR and MASTER_PORT" "$T/out" ||
    fail "without libpmix the error does not say to set MASTER_ADDR and MASTER_PORT"
echo "ok: without libpmix, fails in $(secs "$t0" "$t1") s saying to set MASTER_ADDR and MASTER_PORT"
exit 0
