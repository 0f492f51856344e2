#!/bin/sh
# ddp_tiny under a real Slurm that this test starts and stops itself
# (slurm_local.sh), with no variable set by hand:
#   1. srun -n 4 ddp_tiny: ranks from SLURM_PROCID/SLURM_NTASKS, rank 0's
#      address from the step's node list, its port from job and step id;
#   2. an sbatch job whose script runs srun -n 2 ddp_tiny;
#   3. the pitfall: a batch script that runs ddp_tiny itself (SLURM_PROCID=0,
#      SLURM_NTASKS=2, no step) must fail at once with the clear error.
#   slurm_ddp.sh DDP_TINY
# Exit 77 (skip) without slurm-wlm, munge or root.
set -u
DDP=$1
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/slurm_local.sh"
T=$(mktemp -d /tmp/c10d-slurm.XXXXXX)
chmod 755 "$T"
cleanup() {
    # Cancels our cluster's jobs, waits for them, stops the daemons and
    # kills whatever of the jobs is left (slurm_local.sh).
    slurm_local_stop
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
fail() {
    echo "FAIL: $*"
    for f in "$T"/*.out; do [ -f "$f" ] && { echo "--- $f:"; cat "$f"; }; done
    echo "--- slurmd.log (tail):"
    tail -20 "$SLURM_LOCAL_DIR/slurmd.log" 2>/dev/null
    exit 1
}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

for v in MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE TORCHELASTIC_RUN_ID \
    OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE PMIX_NAMESPACE; do
    unset "$v"
done
# Inherited from a surrounding allocation these would describe another job.
for v in $(env | sed -n 's/^\(SLURM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
unset SLURM_CONF

t0=$(now)
slurm_local_start "$T/slurm"
rc=$?
[ $rc -eq 0 ] || exit $rc
echo "ok: Slurm up in $(secs "$t0" "$(now)") s"
# More tasks than CPUs needs --overcommit (a 2-core machine runs 4 ranks).
OVER=""
[ "$(nproc)" -ge 4 ] || OVER="--overcommit"

# 1. srun -n 4
t0=$(now)
C10D_LOG_LEVEL=INFO timeout 120 srun -K -n 4 $OVER --export=ALL "$DDP" >"$T/srun.out" 2>&1
rc=$?
t1=$(now)
[ $rc -eq 0 ] || fail "srun -n 4 ddp_tiny exited $rc"
grep -q "weights identical on all 4 ranks" "$T/srun.out" || fail "srun: no identical-weights line"
n=$(grep -c "rank [0-3]/4 from Slurm srun (SLURM_PROCID, SLURM_NTASKS), local rank [0-3]/4, master $(hostname -s):[0-9]* from SLURM_STEP_NODELIST" "$T/srun.out")
[ "$n" -eq 4 ] || fail "srun: expected 4 ranks saying where rank, size and master came from, got $n"
echo "ok: srun -n 4 ddp_tiny in $(secs "$t0" "$t1") s"

# 2. sbatch: the job's script runs srun -n 2.
cat >"$T/job.sh" <<JOB
#!/bin/sh
C10D_LOG_LEVEL=INFO srun -K -n 2 $OVER "$DDP"
JOB
t0=$(now)
timeout 180 sbatch --wait -n 2 $OVER -o "$T/sbatch.out" "$T/job.sh" >"$T/submit.out" 2>&1
rc=$?
t1=$(now)
[ $rc -eq 0 ] || fail "sbatch job (srun -n 2 ddp_tiny) exited $rc"
grep -q "weights identical on all 2 ranks" "$T/sbatch.out" || fail "sbatch: no identical-weights line"
grep -q "from Slurm srun" "$T/sbatch.out" || fail "sbatch: ranks did not come from srun"
echo "ok: sbatch job running srun -n 2 ddp_tiny in $(secs "$t0" "$t1") s"

# 3. The pitfall: ddp_tiny straight in the batch script. It must not wait as
# "rank 0 of 2" for a rank nobody starts: one clear error, at once.
cat >"$T/pitfall.sh" <<JOB
#!/bin/sh
echo "batch env: SLURM_PROCID=\${SLURM_PROCID-unset} SLURM_NTASKS=\${SLURM_NTASKS-unset} SLURM_STEP_ID=\${SLURM_STEP_ID-unset}"
s=\$(date +%s)
timeout 60 "$DDP"
echo "ddp_tiny exit \$? after \$((\$(date +%s) - s)) s"
JOB
t0=$(now)
timeout 120 sbatch --wait -n 2 $OVER -o "$T/pitfall.out" "$T/pitfall.sh" >"$T/submit.out" 2>&1
t1=$(now)
grep -q "ddp_tiny exit [1-9]" "$T/pitfall.out" || fail "ddp_tiny in the batch script did not fail"
grep -q "ddp_tiny exit 124" "$T/pitfall.out" && fail "ddp_tiny in the batch script waited (timed out)"
grep -q "no job step (SLURM_STEP_ID is not set)" "$T/pitfall.out" ||
    fail "ddp_tiny in the batch script did not say there is no job step"
grep -q "start it with srun" "$T/pitfall.out" || fail "the error does not say to use srun"
secs_in_job=$(sed -n 's/.*ddp_tiny exit [0-9]* after \([0-9]*\) s/\1/p' "$T/pitfall.out")
[ "${secs_in_job:-99}" -le 5 ] || fail "the error took ${secs_in_job} s"
echo "ok: ddp_tiny in a batch script outside srun fails in ${secs_in_job} s with the clear error (job $(secs "$t0" "$t1") s)"
grep "batch env" "$T/pitfall.out"
exit 0
