#!/bin/sh
# WORLD_SIZE above the ranks started is not a silent wait: rank 0 of 2,
# started alone, warns within about 30 s how many ranks arrived.
#   missing_rank.sh DDP_TINY
set -u
DDP=$1
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 (to find a free port) not installed"; exit 77; }
T=$(mktemp -d /tmp/c10d-missing.XXXXXX)
trap 'rm -rf "$T"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for v in LOCAL_RANK LOCAL_WORLD_SIZE TORCHELASTIC_RUN_ID OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE \
    PMI_RANK PMI_SIZE SLURM_JOB_ID SLURM_STEP_ID SLURM_PROCID SLURM_NTASKS; do
    unset "$v"
done
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 40 "$DDP" >"$T/out" 2>&1
rc=$?
[ $rc -eq 124 ] || { echo "FAIL: rank 0 alone exited $rc before the 40 s bound"; cat "$T/out"; exit 1; }
grep -q " W .*waiting for 1 more ranks: 1 of 2 arrived after 3[0-9] s.*is WORLD_SIZE the number of ranks started" "$T/out" ||
    { echo "FAIL: no warning naming the count within 40 s"; cat "$T/out"; exit 1; }
echo "ok: $(grep -m1 'waiting for 1 more' "$T/out")"
