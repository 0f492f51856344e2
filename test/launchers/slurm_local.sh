# A private one-node Slurm for tests, sourced by the launcher tests:
#   . slurm_local.sh; slurm_local_start DIR || exit $?; ...; slurm_local_stop
# Everything lives in DIR: its own munged (own socket, so another test's
# munge or Slurm is never touched), slurmctld and slurmd on a free port
# pair, state, spool, logs, pid files, slurm.conf. No cgroups anywhere
# (proctrack/linuxproc, task/none, no accounting), so it runs in a
# container as root. Daemons are stopped by the PIDs they wrote, never by
# name; what the jobs leave behind, by the SLURM_CONF in its environment.
# Returns 77 when something it needs is missing or not root.
# After start: SLURM_CONF is exported for srun/sbatch.

slurm_local_log() { echo "slurm_local: $*" >&2; }

# Two free TCP ports, consecutive ones not required.
slurm_local_ports() {
    python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}

slurm_local_start() {
    SLURM_LOCAL_DIR=$1
    for c in slurmctld slurmd munged srun sbatch sinfo python3; do
        command -v "$c" >/dev/null 2>&1 || {
            slurm_local_log "SKIP: $c not installed (scripts/install-deps.sh launchers)"
            return 77
        }
    done
    [ "$(id -u)" -eq 0 ] || { slurm_local_log "SKIP: the daemons need root"; return 77; }
    [ -r /etc/munge/munge.key ] || { slurm_local_log "SKIP: no /etc/munge/munge.key"; return 77; }
    id munge >/dev/null 2>&1 || { slurm_local_log "SKIP: no munge user"; return 77; }
    d=$SLURM_LOCAL_DIR
    mkdir -p "$d/state" "$d/spool" "$d/munge" || return 1
    # munged refuses to run as root; its socket directory must be its own
    # and searchable by everyone (the clients connect to the socket).
    chown munge:munge "$d/munge" && chmod 711 "$d/munge" || return 1
    chmod 755 "$d"
    runuser -u munge -- /usr/sbin/munged --socket="$d/munge/munge.sock" \
        --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" \
        --seed-file="$d/munge/munged.seed" --key-file=/etc/munge/munge.key || {
        slurm_local_log "munged did not start"
        return 1
    }
    set -- $(slurm_local_ports)
    ctld_port=$1 slurmd_port=$2
    host=$(hostname -s)
    # Job ids of this cluster start where no other test's do: two private
    # clusters would both number their first job 1, and ranks derive the
    # store's port from job and step id.
    first_job=$((ctld_port * 100))
    # NodeName and SlurmctldHost must be this host's short name (the daemons
    # compare them with gethostname()); addresses stay on loopback. CPUs as
    # slurmd -C counts them, or the node is drained.
    cpus=$(slurmd -C 2>/dev/null | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -1)
    [ -n "$cpus" ] || cpus=$(nproc)
    export SLURM_CONF="$d/slurm.conf"
    cat >"$SLURM_CONF" <<CONF
ClusterName=c10dtest
FirstJobId=$first_job
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.sock
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    # -i: no saved state to read. Both daemonize and write their pid files.
    slurmctld -i || { slurm_local_log "slurmctld did not start; see $d/slurmctld.log"; return 1; }
    slurmd || { slurm_local_log "slurmd did not start; see $d/slurmd.log"; return 1; }
    i=0
    until sinfo -h -o %T 2>/dev/null | grep -q idle; do
        i=$((i + 1))
        [ $i -lt 60 ] || { slurm_local_log "node not idle after 30 s; see $d/*.log"; return 1; }
        sleep 0.5
    done
    slurm_local_log "up: $d, slurmctld port $ctld_port, slurmd port $slurmd_port"
    return 0
}

# Kills (KILL) every process whose environment holds SLURM_CONF=CONF: the
# job steps' slurmstepd and their tasks (children of neither this shell nor
# slurmd, so nothing else stops them), and any srun left over. Never this
# shell, the scanner itself or their ancestors. Prints what it killed.
slurm_local_kill_strays() {
    python3 - "$1" <<'PY'
import os, signal, sys
needle = b"SLURM_CONF=" + sys.argv[1].encode() + b"\0"
spared, pid = set(), os.getpid()
while pid > 1:  # the scanner and its ancestors
    spared.add(pid)
    try:
        with open("/proc/%d/stat" % pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in spared:
        continue
    try:
        with open("/proc/%s/environ" % name, "rb") as f:
            env = b"\0" + f.read()
        with open("/proc/%s/comm" % name) as f:
            comm = f.read().strip()
    except OSError:
        continue
    if b"\0" + needle in env + b"\0":
        try:
            os.kill(int(name), signal.SIGKILL)
            print("slurm_local: killed stray %s %s" % (name, comm), file=sys.stderr)
        except OSError:
            pass
PY
}

# Stops what start started (safe to call twice or after a failed start):
# cancels this cluster's jobs and waits (at most 5 s) for its queue to
# empty, stops the daemons by pid file and waits for them to go, kills what
# the jobs left behind (scancel is asynchronous; slurmstepd and the tasks
# are not slurmd's children), removes the directory.
slurm_local_stop() {
    d=${SLURM_LOCAL_DIR:-}
    [ -n "$d" ] && [ -d "$d" ] || return 0
    conf="$d/slurm.conf"
    if [ -s "$d/slurmctld.pid" ] && kill -0 "$(cat "$d/slurmctld.pid")" 2>/dev/null; then
        # Only this cluster's jobs: SLURM_CONF names ours.
        SLURM_CONF=$conf scancel --user="$(id -un)" >/dev/null 2>&1
        end=$(($(date +%s) + 5))
        while :; do
            q=$(SLURM_CONF=$conf timeout 2 squeue -h -o %i 2>/dev/null) || break
            [ -n "$q" ] && [ "$(date +%s)" -lt "$end" ] || break
            sleep 0.2
        done
        [ -z "${q:-}" ] || slurm_local_log "jobs still queued after 5 s:" $q
    fi
    pids=""
    for f in "$d/slurmd.pid" "$d/slurmctld.pid" "$d/munge/munged.pid"; do
        [ -s "$f" ] || continue
        p=$(cat "$f")
        kill "$p" 2>/dev/null && pids="$pids $p"
    done
    i=0
    for p in $pids; do
        while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do
            i=$((i + 1))
            sleep 0.1
        done
        kill -9 "$p" 2>/dev/null || true
    done
    slurm_local_kill_strays "$conf"
    rm -rf "$d"
    SLURM_LOCAL_DIR=
}
