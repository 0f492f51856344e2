#!/usr/bin/env bash
# Tests of the c10drun launcher: environment, output prefixes, failure handling, signals,
# --timeout, the external store. Ranks are small shell scripts that record their pid (and
# their children's) so the test can check that nothing is left running.
#
# usage: test_c10drun.sh PATH/TO/c10drun [BUILD_DIR]
set -u

RUN=${1:?usage: test_c10drun.sh PATH/TO/c10drun [BUILD_DIR]}
BUILD=${2:-}
T=$(mktemp -d "${TMPDIR:-/tmp}/test_c10drun.XXXXXX")
# ddp_tiny failing on purpose dumps its flight recorder: into the test directory.
export C10D_TRACE_FILE_PREFIX="$T/fr_rank"
BG=() # c10drun processes started in the background
FAILS=0

cleanup() {
    local p f
    for p in "${BG[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for f in "$T"/*.pid; do
        [ -s "$f" ] || continue
        p=$(cat "$f")
        kill -KILL -- "-$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
    rm -rf "$T"
}
trap cleanup EXIT
# Every c10drun run is bounded; timeout(1) sends SIGTERM, which c10drun forwards.
c10drun() { timeout -k 10 120 "$RUN" "$@"; }

fail() {
    echo "FAIL: $*"
    FAILS=$((FAILS + 1))
}
pass() { echo "ok:   $*"; }

# A zombie (its parent has not reaped it yet) counts as gone.
alive() {
    [ -r "/proc/$1/stat" ] || return 1
    local state
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# wait_gone PID...: true once every PID is gone; bounded.
wait_gone() {
    local p left
    for _ in $(seq 1 200); do
        left=0
        for p in "$@"; do
            alive "$p" && left=1
        done
        [ $left = 0 ] && return 0
        sleep 0.05
    done
    return 1
}

# wait_files N GLOB: until N files match (the ranks have written their pids); bounded.
wait_files() {
    local n=$1 glob=$2
    for _ in $(seq 1 600); do
        # shellcheck disable=SC2086
        [ "$(ls $glob 2>/dev/null | wc -l)" -ge "$n" ] && return 0
        sleep 0.05
    done
    return 1
}

# check_gone CASE GLOB: every pid recorded in files matching GLOB is gone.
check_gone() {
    local name=$1 glob=$2 f pids=()
    for f in $glob; do
        [ -s "$f" ] && pids+=("$(cat "$f")")
    done
    if [ ${#pids[@]} = 0 ]; then
        fail "$name: no pid files $glob"
    elif wait_gone "${pids[@]}"; then
        pass "$name: no process left (${#pids[@]} checked)"
    else
        fail "$name: processes left: ${pids[*]}"
    fi
}

expect_rc() {
    if [ "$2" = "$3" ]; then pass "$1: exit status $2"; else fail "$1: exit status $2, want $3"; fi
}

expect_line() { # name file fixed-string
    if grep -qxF -- "$3" "$2"; then pass "$1: has '$3'"; else
        fail "$1: no line '$3' in $2:"
        sed 's/^/    | /' "$2"
    fi
}

expect_match() { # name file regex
    if grep -qE -- "$3" "$2"; then pass "$1: matches '$3'"; else
        fail "$1: nothing matches '$3' in $2:"
        sed 's/^/    | /' "$2"
    fi
}

expect_no_match() {
    if grep -qE -- "$3" "$2"; then
        fail "$1: unexpected '$3' in $2"
    else pass "$1: no '$3'"; fi
}

# ---------------------------------------------------------------- all ranks succeed, env
RANK=99 WORLD_SIZE=77 c10drun -n 3 sh -c 'echo "env $RANK $LOCAL_RANK $GROUP_RANK $ROLE_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $ROLE_WORLD_SIZE $MASTER_ADDR $TORCHELASTIC_USE_AGENT_STORE"; echo "port $MASTER_PORT"; echo "run $TORCHELASTIC_RUN_ID"' \
    >"$T/env.out" 2>"$T/env.err"
expect_rc env $? 0
for r in 0 1 2; do
    expect_line env "$T/env.out" "[rank$r]: env $r $r 0 $r 3 3 3 127.0.0.1 False"
done
ports=$(sed -n 's/^\[rank[0-9]*\]: port //p' "$T/env.out" | sort -u)
if [ "$(echo "$ports" | wc -l)" = 1 ] && [ "$ports" -gt 0 ] 2>/dev/null; then
    pass "env: one MASTER_PORT for all ranks ($ports)"
else fail "env: MASTER_PORT values '$ports'"; fi
runs=$(sed -n 's/^\[rank[0-9]*\]: run //p' "$T/env.out" | sort -u)
if [ "$(echo "$runs" | wc -l)" = 1 ] && [ -n "$runs" ]; then
    pass "env: one TORCHELASTIC_RUN_ID ($runs)"
else fail "env: TORCHELASTIC_RUN_ID values '$runs'"; fi
if [ ! -s "$T/env.err" ]; then pass "env: nothing on stderr"; else fail "env: stderr not empty"; fi

c10drun -n 2 --master-addr localhost --master-port 12345 --run-id job7 \
    sh -c 'echo "$MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RUN_ID"' >"$T/addr.out" 2>&1
expect_rc master-addr $? 0
expect_line master-addr "$T/addr.out" "[rank1]: localhost 12345 job7"

# A PROGRAM's own options are not c10drun's.
c10drun -n 1 sh -c 'echo "$0 $1"' -n x >"$T/args.out" 2>&1
expect_rc args $? 0
expect_line args "$T/args.out" "[rank0]: -n x"

# ---------------------------------------------------------------- output prefixes
c10drun -n 2 sh -c 'printf "a\nb\n"; echo "e$RANK" >&2; printf "tail$RANK"' \
    >"$T/pre.out" 2>"$T/pre.err"
expect_rc prefix $? 0
for r in 0 1; do
    expect_line prefix "$T/pre.out" "[rank$r]: a"
    expect_line prefix "$T/pre.out" "[rank$r]: b"
    expect_line prefix "$T/pre.out" "[rank$r]: tail$r"
    expect_line prefix "$T/pre.err" "[rank$r]: e$r"
done
expect_no_match prefix-stdout "$T/pre.out" 'e[01]$'
expect_no_match prefix-stderr "$T/pre.err" ': (a|b|tail.)$'
n=$(wc -l <"$T/pre.out")
if [ "$n" = 6 ]; then pass "prefix: 6 stdout lines"; else fail "prefix: $n stdout lines, want 6"; fi

c10drun -n 2 --no-prefix sh -c 'echo "plain$RANK"' >"$T/nopre.out" 2>&1
expect_rc no-prefix $? 0
expect_line no-prefix "$T/nopre.out" "plain0"
expect_line no-prefix "$T/nopre.out" "plain1"

# --bind-to core: each rank on its own CPU of c10drun's mask; --bind-to none leaves
# the mask alone; more ranks than CPUs and unknown policies are usage errors.
cpus=$(nproc)
if [ "$cpus" -ge 2 ]; then
    c10drun -n 2 --bind-to core sh -c 'grep Cpus_allowed_list /proc/self/status | tr -d "\t"' \
        >"$T/bind.out" 2>&1
    expect_rc bind-core $? 0
    n0=$(sed -n 's/^\[rank0\]: Cpus_allowed_list:\([0-9]*\)$/\1/p' "$T/bind.out")
    n1=$(sed -n 's/^\[rank1\]: Cpus_allowed_list:\([0-9]*\)$/\1/p' "$T/bind.out")
    if [ -n "$n0" ] && [ -n "$n1" ] && [ "$n0" != "$n1" ]; then
        pass "bind-core: rank0 on CPU $n0, rank1 on CPU $n1"
    else
        fail "bind-core: expected one distinct CPU per rank, got: $(cat "$T/bind.out")"
    fi
fi
c10drun -n 1 --bind-to none sh -c 'grep Cpus_allowed_list /proc/self/status' >"$T/nobind.out" 2>&1
expect_rc bind-none $? 0
expect_line bind-none "$T/nobind.out" "[rank0]: $(grep Cpus_allowed_list /proc/self/status)"
c10drun -n $((cpus + 1)) --bind-to core true >"$T/bindmany.out" 2>&1
expect_rc bind-too-many $? 2
expect_line bind-too-many "$T/bindmany.out" \
    "c10drun: --bind-to core: $((cpus + 1)) ranks but only $cpus CPUs available; use --bind-to none"
c10drun -n 1 --bind-to socket true >"$T/bindbad.out" 2>&1
expect_rc bind-bad $? 2
expect_line bind-bad "$T/bindbad.out" "c10drun: --bind-to wants none or core, got 'socket'"

# Many lines, read in many chunks: none lost, none cut, each rank's in order.
c10drun -n 2 seq 1 20000 >"$T/many.out" 2>&1
expect_rc many-lines $? 0
for r in 0 1; do
    if sed -n "s/^\[rank$r\]: //p" "$T/many.out" | cmp -s - <(seq 1 20000); then
        pass "many-lines: rank $r's 20000 lines intact and in order"
    else fail "many-lines: rank $r's lines differ"; fi
done

# Our stdout goes away (`| head`): the ranks' next write fails as in a plain pipeline.
timeout -k 10 120 "$RUN" -n 2 yes 2>"$T/head.err" | head -n 3 >"$T/head.out"
expect_rc stdout-closed "${PIPESTATUS[0]}" 141
expect_match stdout-closed "$T/head.err" '^c10drun: rank [01] \(pid [0-9]+\) killed by signal 13 \(SIGPIPE\)$'

# ---------------------------------------------------------------- a failing rank
# Every rank records its pid and a child's; rank 1 fails once all have started.
rank_script='echo $$ > "$D/$C.r$RANK.pid"; sleep 1000 & echo $! > "$D/$C.c$RANK.pid";
while [ "$(ls "$D"/$C.c*.pid 2>/dev/null | wc -l)" -lt "$WORLD_SIZE" ]; do sleep 0.05; done;
'
D=$T C=fail c10drun -n 3 --grace-ms 2000 sh -c "$rank_script"'
if [ "$RANK" = 1 ]; then echo "rank 1 fails"; exit 3; fi; wait' >"$T/fail.out" 2>"$T/fail.err"
expect_rc fail $? 3
expect_line fail "$T/fail.err" "c10drun: rank 1 (pid $(cat "$T/fail.r1.pid" 2>/dev/null)) exited with status 3"
expect_line fail "$T/fail.out" "[rank1]: rank 1 fails"
n=$(grep -c '^c10drun: rank' "$T/fail.err")
if [ "$n" = 1 ]; then pass "fail: one failure line"; else fail "fail: $n failure lines"; fi
check_gone fail "$T/fail.*.pid"

# ---------------------------------------------------------------- a rank killed by a signal
D=$T C=sig c10drun -n 2 sh -c "$rank_script"'
if [ "$RANK" = 1 ]; then kill -KILL $$; fi; wait' >"$T/sig.out" 2>"$T/sig.err"
expect_rc signal $? 137
expect_line signal "$T/sig.err" "c10drun: rank 1 (pid $(cat "$T/sig.r1.pid" 2>/dev/null)) killed by signal 9 (SIGKILL)"
check_gone signal "$T/sig.*.pid"

# ---------------------------------------------------------------- SIGTERM to c10drun
D=$T C=term "$RUN" -n 2 sh -c 'trap "echo got-TERM; exit 0" TERM; '"$rank_script"'wait' >"$T/term.out" 2>"$T/term.err" &
pid=$!
BG+=("$pid")
if wait_files 4 "$T/term.*.pid"; then
    kill -TERM "$pid"
else
    fail "term: ranks did not start"
    kill -KILL "$pid"
fi
if wait_gone "$pid"; then :; else
    fail "term: c10drun still running"
    kill -KILL "$pid"
fi
wait "$pid"
expect_rc sigterm $? 143
expect_line sigterm "$T/term.out" "[rank0]: got-TERM"
expect_line sigterm "$T/term.out" "[rank1]: got-TERM"
expect_match sigterm "$T/term.err" '^c10drun: received SIGTERM'
check_gone sigterm "$T/term.*.pid"

# ---------------------------------------------------------------- SIGINT, ranks ignore it
# The ranks ignore SIGINT and SIGTERM: only the SIGKILL after --grace-ms ends them.
D=$T C=int "$RUN" -n 2 --grace-ms 200 sh -c 'trap "" INT TERM; '"$rank_script"'
while :; do sleep 0.1; done' >"$T/int.out" 2>"$T/int.err" &
pid=$!
BG+=("$pid")
if wait_files 4 "$T/int.*.pid"; then
    kill -INT "$pid"
else
    fail "sigint: ranks did not start"
    kill -KILL "$pid"
fi
if wait_gone "$pid"; then :; else
    fail "sigint: c10drun still running"
    kill -KILL "$pid"
fi
wait "$pid"
expect_rc sigint $? 130
expect_match sigint "$T/int.err" '^c10drun: received SIGINT'
expect_match sigint "$T/int.err" 'sending SIGKILL'
check_gone sigint "$T/int.*.pid"

# ---------------------------------------------------------------- c10drun killed with SIGKILL
# Nothing can forward that; the kernel's parent-death signal stops the ranks.
D=$T C=orphan "$RUN" -n 2 sh -c 'echo $$ > "$D/$C.r$RANK.pid"; exec sleep 1000' \
    >"$T/orphan.out" 2>&1 &
pid=$!
BG+=("$pid")
if wait_files 2 "$T/orphan.*.pid"; then
    # The pid file is written before the exec: wait until the rank is the sleep.
    for _ in $(seq 1 200); do
        n=0
        for f in "$T"/orphan.*.pid; do
            grep -q sleep "/proc/$(cat "$f")/cmdline" 2>/dev/null && n=$((n + 1))
        done
        [ $n = 2 ] && break
        sleep 0.05
    done
fi
# (stderr off: bash reports the killed job)
{
    kill -KILL "$pid"
    wait "$pid"
} 2>/dev/null
check_gone orphan "$T/orphan.*.pid"

# ---------------------------------------------------------------- --timeout
D=$T C=tmo c10drun -n 2 --timeout 1 sh -c "$rank_script"'wait' >"$T/tmo.out" 2>"$T/tmo.err"
expect_rc timeout $? 124
expect_match timeout "$T/tmo.err" '^c10drun: timeout'
check_gone timeout "$T/tmo.*.pid"

# ---------------------------------------------------------------- usage errors
c10drun sh -c true >/dev/null 2>&1
expect_rc "missing -n" $? 2
c10drun -n 2 /nonexistent/program >/dev/null 2>"$T/nf.err"
expect_rc "no such program" $? 127
c10drun -n 2 --store nowhere true >/dev/null 2>&1
expect_rc "bad --store" $? 2
c10drun -n 2 --store external --store-bin /nonexistent/c10d-store true >/dev/null 2>&1
expect_rc "missing store binary" $? 1

# ---------------------------------------------------------------- --store external
# Each rank connects to MASTER_ADDR:MASTER_PORT (bash's /dev/tcp), which only works if the
# launcher started the store and waited for it.
store_rank='echo "agent=$TORCHELASTIC_USE_AGENT_STORE"; exec 3<>"/dev/tcp/$MASTER_ADDR/$MASTER_PORT" && echo connected'

run_external() { # name store-binary-or-empty
    local name=$1
    shift
    c10drun -v -n 2 --store external --store-timeout 20 "$@" bash -c "$store_rank" \
        >"$T/$name.out" 2>"$T/$name.err"
    expect_rc "$name" $? 0
    for r in 0 1; do
        expect_line "$name" "$T/$name.out" "[rank$r]: agent=True"
        expect_line "$name" "$T/$name.out" "[rank$r]: connected"
    done
    # -v names the store's pid: it must be gone once c10drun has returned.
    sed -n 's/^c10drun: store: .* (pid \([0-9]*\))$/\1/p' "$T/$name.err" >"$T/$name.s.pid"
    check_gone "$name" "$T/$name.s.pid"
}

if command -v python3 >/dev/null 2>&1; then
    # A stand-in with c10d-store's command line, so the launcher's side is tested even before
    # the real server exists: it records its pid and accepts connections until terminated.
    cat >"$T/fake-store" <<EOF
#!$(command -v python3)
import os, socket, sys
a = sys.argv
assert a[1] == "serve", a
host, port = a[a.index("--host") + 1], int(a[a.index("--port") + 1])
if os.environ.get("FAKE_STORE_FAIL"):
    print("fake store: failing on purpose", file=sys.stderr)
    sys.exit(5)
s = socket.create_server((host, port))
print("fake store listening", flush=True)
while True:
    c, _ = s.accept()
    c.close()
EOF
    chmod +x "$T/fake-store"
    run_external external-fake --store-bin "$T/fake-store"
    expect_line external-fake "$T/external-fake.out" "[store]: fake store listening"

    FAKE_STORE_FAIL=1 c10drun -n 2 --store external --store-bin "$T/fake-store" true \
        >"$T/sfail.out" 2>"$T/sfail.err"
    expect_rc store-fails $? 1
    expect_match store-fails "$T/sfail.err" 'exited with status 5 before accepting connections'
    expect_line store-fails "$T/sfail.err" "[store]: fake store: failing on purpose"
else
    echo "SKIP: external store with a stand-in server (no python3)"
fi

store_bin=""
for cand in ${BUILD:+"$BUILD/store_server/c10d-store"} "$(dirname "$RUN")/../../store_server/c10d-store"; do
    if [ -x "$cand" ]; then
        store_bin=$cand
        break
    fi
done
if [ -n "$store_bin" ]; then
    # No --store-bin: c10drun must find the store in the build tree by itself.
    run_external external-real
else
    echo "SKIP: --store external with the real c10d-store: not built" \
        "(looked for ${BUILD:-<no build dir>}/store_server/c10d-store)"
fi

# ---------------------------------------------------------------- option names, PET_* defaults
c10drun --nnodez 2 -n 1 true >/dev/null 2>"$T/typo.err"
expect_rc typo $? 2
expect_line typo "$T/typo.err" "c10drun: unknown option --nnodez; did you mean --nnodes?"
c10drun --max_restrats 1 -n 1 true >/dev/null 2>"$T/typo2.err"
expect_rc typo-underscore $? 2
expect_line typo-underscore "$T/typo2.err" "c10drun: unknown option --max_restrats; did you mean --max-restarts?"
c10drun --frobnicate -n 1 true >/dev/null 2>"$T/typo3.err"
expect_rc typo-far $? 2
expect_line typo-far "$T/typo3.err" "c10drun: unknown option --frobnicate (c10drun --help lists them)"
c10drun -n 1 --nnodes >/dev/null 2>"$T/noval.err"
expect_rc no-value $? 2
expect_line no-value "$T/noval.err" "c10drun: option --nnodes wants a value"
"$RUN" --help >"$T/help.out"
for flag in --nnodes --node-rank --rdzv-endpoint --rdzv-backend --rdzv-id --standalone \
    --max-restarts --failure-grace-ms --log-dir --tee --redirects PET_FOO_BAR; do
    if grep -q -- "$flag" "$T/help.out"; then pass "help: names $flag"; else fail "help: no $flag"; fi
done

# PET_<OPTION> is the option's default; the command line wins.
PET_NPROC_PER_NODE=2 PET_MAX_RESTARTS=4 PET_RDZV_ID=petjob c10drun \
    sh -c 'echo "$RANK/$WORLD_SIZE $TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID"' >"$T/pet.out" 2>&1
expect_rc pet $? 0
expect_line pet "$T/pet.out" "[rank1]: 1/2 4 petjob"
PET_NPROC_PER_NODE=2 PET_RUN_ID=x c10drun -n 3 --run-id cmdline sh -c 'echo "$WORLD_SIZE $TORCHELASTIC_RUN_ID"' \
    >"$T/pet2.out" 2>&1
expect_rc pet-overridden $? 0
expect_line pet-overridden "$T/pet2.out" "[rank2]: 3 cmdline"
PET_NNODES=0 c10drun -n 1 true >/dev/null 2>"$T/pet3.err"
expect_rc pet-bad $? 2
expect_match pet-bad "$T/pet3.err" '^c10drun: PET_NNODES wants a number of nodes'
PET_STANDALONE=1 c10drun -n 1 sh -c 'echo "$MASTER_ADDR $GROUP_WORLD_SIZE"' >"$T/pet4.out" 2>&1
expect_rc pet-flag $? 0
expect_line pet-flag "$T/pet4.out" "[rank0]: 127.0.0.1 1"

# ---------------------------------------------------------------- --nnodes, --node-rank, --standalone
c10drun --nnodes 1:4 -n 1 true >/dev/null 2>"$T/elastic.err"
expect_rc nnodes-elastic $? 2
expect_match nnodes-elastic "$T/elastic.err" 'elastic membership \(MIN:MAX nodes\) is not supported'
c10drun --nnodes 1:1 -n 1 sh -c 'echo "$GROUP_WORLD_SIZE"' >"$T/nn11.out" 2>&1
expect_rc nnodes-N:N $? 0
expect_line nnodes-N:N "$T/nn11.out" "[rank0]: 1"
c10drun --nnodes 2 --rdzv-endpoint 127.0.0.1:1 -n 1 true >/dev/null 2>"$T/nonr.err"
expect_rc nnodes-no-node-rank $? 2
expect_match nnodes-no-node-rank "$T/nonr.err" '^c10drun: --nnodes 2 needs --node-rank R'
c10drun --nnodes 2 --node-rank 1 -n 1 true >/dev/null 2>"$T/noep.err"
expect_rc nnodes-no-endpoint $? 2
expect_match nnodes-no-endpoint "$T/noep.err" 'needs --rdzv-endpoint HOST:PORT'
c10drun --nnodes 2 --node-rank 2 --rdzv-endpoint 127.0.0.1 -n 1 true >/dev/null 2>"$T/nrr.err"
expect_rc node-rank-range $? 2
expect_line node-rank-range "$T/nrr.err" "c10drun: --node-rank 2 is out of range for --nnodes 2"
c10drun --nnodes 2 --node-rank 0 --rdzv-endpoint 127.0.0.1:1 --store embedded -n 1 true \
    >/dev/null 2>"$T/emb.err"
expect_rc nnodes-embedded $? 2
c10drun --rdzv-backend etcd -n 1 true >/dev/null 2>"$T/be.err"
expect_rc rdzv-backend-bad $? 2
expect_line rdzv-backend-bad "$T/be.err" "c10drun: --rdzv-backend wants static or c10d, got 'etcd'"
c10drun --standalone --nnodes 3 -n 2 sh -c 'echo "$MASTER_ADDR $WORLD_SIZE $GROUP_RANK $TORCHELASTIC_USE_AGENT_STORE"' \
    >"$T/sa.out" 2>"$T/sa.err"
expect_rc standalone $? 0
expect_line standalone "$T/sa.out" "[rank1]: 127.0.0.1 2 0 False"
expect_match standalone "$T/sa.err" '^c10drun: --standalone: ignoring --nnodes'

# -n auto|cpu|gpu
c10drun -n cpu sh -c 'echo "$LOCAL_WORLD_SIZE"' >"$T/ncpu.out" 2>&1
expect_rc nproc-cpu $? 0
expect_line nproc-cpu "$T/ncpu.out" "[rank0]: $(getconf _NPROCESSORS_ONLN)"
gpus=0
if [ -d /proc/driver/nvidia/gpus ]; then
    gpus=$(ls /proc/driver/nvidia/gpus | wc -l)
elif command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    echo "SKIP: -n gpu/auto counts (CUDA_VISIBLE_DEVICES is set)"
elif [ "$gpus" = 0 ]; then
    c10drun -n gpu true >/dev/null 2>"$T/ngpu.err"
    expect_rc nproc-gpu-none $? 2
    expect_match nproc-gpu-none "$T/ngpu.err" '^c10drun: -n gpu: no NVIDIA GPU found'
    c10drun -n auto sh -c 'echo "$LOCAL_WORLD_SIZE"' >"$T/nauto.out" 2>&1
    expect_line nproc-auto "$T/nauto.out" "[rank0]: $(getconf _NPROCESSORS_ONLN)"
else
    c10drun -n gpu sh -c 'echo "$LOCAL_WORLD_SIZE"' >"$T/ngpu.out" 2>&1
    expect_line nproc-gpu "$T/ngpu.out" "[rank0]: $gpus"
    c10drun -n auto sh -c 'echo "$LOCAL_WORLD_SIZE"' >"$T/nauto.out" 2>&1
    expect_line nproc-auto "$T/nauto.out" "[rank0]: $gpus"
fi
# Without a driver here, a stand-in nvidia-smi shows how GPUs are counted (-L lines, cut to
# CUDA_VISIBLE_DEVICES).
if [ ! -d /proc/driver/nvidia/gpus ]; then
    mkdir -p "$T/bin"
    printf '#!/bin/sh\n[ "$1" = -L ] || exit 9\necho "GPU 0: Fake (UUID: GPU-0)"\necho "GPU 1: Fake (UUID: GPU-1)"\necho "GPU 2: Fake (UUID: GPU-2)"\n' \
        >"$T/bin/nvidia-smi"
    chmod +x "$T/bin/nvidia-smi"
    (unset CUDA_VISIBLE_DEVICES; PATH=$T/bin:$PATH c10drun -n gpu sh -c 'echo "$LOCAL_WORLD_SIZE"') >"$T/fgpu.out" 2>&1
    expect_line nproc-gpu-smi "$T/fgpu.out" "[rank2]: 3"
    (unset CUDA_VISIBLE_DEVICES; PATH=$T/bin:$PATH c10drun -n auto sh -c 'echo "$LOCAL_WORLD_SIZE"') >"$T/fauto.out" 2>&1
    expect_line nproc-auto-smi "$T/fauto.out" "[rank0]: 3"
    CUDA_VISIBLE_DEVICES=2,0 PATH=$T/bin:$PATH c10drun -n gpu sh -c 'echo "$LOCAL_WORLD_SIZE"' >"$T/fcvd.out" 2>&1
    expect_line nproc-gpu-visible "$T/fcvd.out" "[rank1]: 2"
fi
c10drun -n lots true >/dev/null 2>"$T/nbad.err"
expect_rc nproc-bad $? 2

# Two nodes on this host (loopback): each rank's torchrun variables, and node 0's store.
if [ -n "$store_bin" ] && command -v python3 >/dev/null 2>&1; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    prog='echo "R=$RANK L=$LOCAL_RANK G=$GROUP_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE GW=$GROUP_WORLD_SIZE RR=$ROLE_RANK RW=$ROLE_WORLD_SIZE A=$TORCHELASTIC_USE_AGENT_STORE $MASTER_ADDR:$MASTER_PORT $TORCHELASTIC_RUN_ID"'
    # Node 0's store listens on every address (C10D_STORE_BIND, as for rank 0's own store).
    for k in 1 0; do
        C10D_STORE_BIND=$([ $k = 0 ] && echo '*') timeout -k 10 120 "$RUN" -v --nnodes 2 --node-rank $k \
            -n 2 --rdzv-endpoint "127.0.0.1:$port" \
            --rdzv-id twonodes sh -c "$prog" >"$T/2n$k.out" 2>"$T/2n$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    # shellcheck disable=SC2154
    wait "$pid1"
    expect_rc two-nodes-1 $? 0
    # shellcheck disable=SC2154
    wait "$pid0"
    expect_rc two-nodes-0 $? 0
    expect_line two-nodes "$T/2n0.out" "[rank1]: R=1 L=1 G=0 W=4 LW=2 GW=2 RR=1 RW=4 A=True 127.0.0.1:$port twonodes"
    expect_line two-nodes "$T/2n1.out" "[rank2]: R=2 L=0 G=1 W=4 LW=2 GW=2 RR=2 RW=4 A=True 127.0.0.1:$port twonodes"
    expect_line two-nodes "$T/2n1.out" "[rank3]: R=3 L=1 G=1 W=4 LW=2 GW=2 RR=3 RW=4 A=True 127.0.0.1:$port twonodes"
    expect_match two-nodes "$T/2n0.err" "^c10drun: store: .* serve --host \\* --port $port "
    # SIGTERM to node 1's c10drun: node 0's hears of it through the store and stops its ranks.
    for k in 0 1; do
        D=$T C=sn$k timeout -k 10 120 "$RUN" --nnodes 2 --node-rank $k -n 2 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id sigjob --failure-grace-ms 200 \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"; exec sleep 100' >"$T/sn$k.out" 2>"$T/sn$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    if wait_files 4 "$T/sn*.r*.pid"; then kill -TERM "$pid1"; else fail "node-signal: ranks did not start"; fi
    wait "$pid1"
    expect_rc node-signal-1 $? 143
    wait "$pid0"
    expect_rc node-signal-0 $? 1
    expect_line node-signal "$T/sn0.err" "c10drun: node 1: c10drun received SIGTERM; stopping this node's ranks"
    check_gone node-signal "$T/sn*.r*.pid"
    # Node 0's c10drun killed outright: its store goes (the kernel's parent-death signal), and
    # node 1's c10drun, which loses it, stops its ranks and fails within seconds.
    for k in 0 1; do
        # Node 0 unwrapped (no timeout(1)): it is the process killed below; cleanup() bounds it.
        wrap=(timeout -k 10 120)
        [ $k = 0 ] && wrap=()
        D=$T C=sl$k "${wrap[@]}" "$RUN" --nnodes 2 --node-rank $k -n 1 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id lostjob \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"; exec sleep 100' >"$T/sl$k.out" 2>"$T/sl$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    if wait_files 2 "$T/sl*.r*.pid"; then
        kill -KILL "$pid0"
    else fail "store-lost: ranks did not start"; fi
    start=$(date +%s%N)
    wait "$pid1"
    expect_rc store-lost $? 1
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$ms" -lt 15000 ]; then pass "store-lost: node 1 gave up after $ms ms"; else
        fail "store-lost: node 1 took $ms ms"
    fi
    expect_match store-lost "$T/sl1.err" "^c10drun: lost the store at 127.0.0.1:$port"
    wait "$pid0" 2>/dev/null
    check_gone store-lost "$T/sl*.r*.pid"
    # A restart needs every node: node 1 reports its rank's failure and is then killed
    # outright; node 0 stops its ranks, waits --store-timeout for node 1, and fails.
    for k in 0 1; do
        wrap=(timeout -k 10 120)
        [ $k = 1 ] && wrap=()
        D=$T C=rw$k "${wrap[@]}" "$RUN" --nnodes 2 --node-rank $k -n 1 --max-restarts 1 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id rwjob --store-timeout 2 --failure-grace-ms 3000 \
            sh -c 'echo $$ > "$D/$C.r$RANK.a$TORCHELASTIC_RESTART_COUNT.pid"; [ "$RANK" = 1 ] && exit 5; exec sleep 100' \
            >"$T/rw$k.out" 2>"$T/rw$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    for _ in $(seq 1 200); do
        grep -q 'exited with status 5' "$T/rw1.err" 2>/dev/null && break
        sleep 0.05
    done
    kill -KILL "$pid1"
    wait "$pid1" 2>/dev/null
    wait "$pid0"
    expect_rc restart-needs-all $? 1
    expect_match restart-needs-all "$T/rw0.err" "^c10drun: node 1: rank 1 \\(pid [0-9]+\\) exited with status 5; stopping"
    expect_line restart-needs-all "$T/rw0.err" \
        "c10drun: only 1 of 2 node(s) stopped their ranks within 2 s (--store-timeout); no restart"
    if ls "$T"/rw0.r0.a1.pid >/dev/null 2>&1; then fail "restart-needs-all: node 0 restarted"; else
        pass "restart-needs-all: no second attempt"
    fi
    check_gone restart-needs-all "$T/rw*.pid"
    # Nodes that run different numbers of ranks (here -n 2 and PET_NPROC_PER_NODE=1) would
    # disagree on RANK and WORLD_SIZE: every node names each node's value and fails at once,
    # before starting any rank.
    start=$(date +%s%N)
    for k in 0 1; do
        nproc=(-n 2)
        [ $k = 1 ] && nproc=()
        D=$T C=np$k PET_NPROC_PER_NODE=1 timeout -k 5 30 "$RUN" --nnodes 2 --node-rank $k "${nproc[@]}" \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id npjob \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"; exec sleep 100' >"$T/np$k.out" 2>"$T/np$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    wait "$pid0"
    expect_rc nproc-differ-0 $? 1
    wait "$pid1"
    expect_rc nproc-differ-1 $? 1
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$ms" -lt 10000 ]; then pass "nproc-differ: both nodes failed after $ms ms"; else
        fail "nproc-differ: took $ms ms"
    fi
    for k in 0 1; do
        expect_line nproc-differ "$T/np$k.err" \
            "c10drun: the nodes do not run the same number of ranks: node 0: 2 (-n 2), node 1: 1 (PET_NPROC_PER_NODE 1); every node needs the same -n (WORLD_SIZE is --nnodes x n); not starting the ranks"
    done
    if ls "$T"/np*.pid >/dev/null 2>&1; then fail "nproc-differ: ranks were started"; else
        pass "nproc-differ: no rank started"
    fi
    # Node 1's c10drun is SIGKILLed while its rank runs (the kernel then stops that rank), and
    # node 0's rank exits 0 after that: node 0 waits for node 1, which will never say whether
    # it is done. Its heartbeat stops; node 0 gives up after --store-timeout (2 s), exits 1.
    for k in 0 1; do
        wrap=(timeout -k 5 30)
        [ $k = 1 ] && wrap=()
        D=$T C=hb$k "${wrap[@]}" "$RUN" --nnodes 2 --node-rank $k -n 1 --store-timeout 2 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id hbjob \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"
                if [ "$RANK" = 0 ]; then while [ ! -e "$D/hb.go" ]; do sleep 0.05; done; exit 0; fi
                exec sleep 100' >"$T/hb$k.out" 2>"$T/hb$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    if wait_files 2 "$T/hb*.r*.pid"; then
        kill -KILL "$pid1"
        touch "$T/hb.go"
    else fail "node-silent-done: ranks did not start"; fi
    start=$(date +%s%N)
    wait "$pid0"
    expect_rc node-silent-done $? 1
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$ms" -lt 8000 ]; then pass "node-silent-done: node 0 gave up after $ms ms"; else
        fail "node-silent-done: node 0 took $ms ms"
    fi
    expect_line node-silent-done "$T/hb0.err" \
        "c10drun: this node's ranks all exited 0, but no word from the c10drun of node(s) 1 for 2 s (--store-timeout): killed, or its host lost; how the ranks there ended is unknown, so the job failed"
    wait "$pid1" 2>/dev/null
    check_gone node-silent-done "$T/hb*.r*.pid"
    # The same while node 0's rank still runs: node 0 stops it.
    for k in 0 1; do
        wrap=(timeout -k 5 30)
        [ $k = 1 ] && wrap=()
        D=$T C=hr$k "${wrap[@]}" "$RUN" --nnodes 2 --node-rank $k -n 1 --store-timeout 2 \
            --failure-grace-ms 200 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id hrjob \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"; exec sleep 100' >"$T/hr$k.out" 2>"$T/hr$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    if wait_files 2 "$T/hr*.r*.pid"; then kill -KILL "$pid1"; else fail "node-silent-run: ranks did not start"; fi
    start=$(date +%s%N)
    wait "$pid0"
    expect_rc node-silent-run $? 1
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$ms" -lt 8000 ]; then pass "node-silent-run: node 0 stopped after $ms ms"; else
        fail "node-silent-run: node 0 took $ms ms"
    fi
    expect_line node-silent-run "$T/hr0.err" \
        "c10drun: no word from the c10drun of node(s) 1 for 2 s (--store-timeout): killed, or its host lost; stopping this node's ranks"
    wait "$pid1" 2>/dev/null
    check_gone node-silent-run "$T/hr*.r*.pid"
    # Node 1 that finished (said done) and then vanished is not a failure, though its
    # heartbeat stops for longer than --store-timeout while node 0's rank still runs: node 0
    # exits 0 once its own ranks are done, after waiting a bounded time (10 s) for node 1 to
    # leave.
    for k in 0 1; do
        wrap=(timeout -k 5 60)
        [ $k = 1 ] && wrap=()
        D=$T C=hd$k "${wrap[@]}" "$RUN" --nnodes 2 --node-rank $k -n 1 --store-timeout 2 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id hdjob \
            sh -c 'echo $$ > "$D/$C.r$RANK.pid"
                if [ "$RANK" = 0 ]; then while [ ! -e "$D/hd.go" ]; do sleep 0.05; done; fi' \
            >"$T/hd$k.out" 2>"$T/hd$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    # Node 1's rank is done at once; 1 s later its c10drun has said so in the store.
    if wait_files 2 "$T/hd*.r*.pid"; then
        sleep 1
        kill -KILL "$pid1"
        sleep 3.5
        touch "$T/hd.go"
    else fail "node-done-then-gone: ranks did not start"; fi
    wait "$pid0"
    expect_rc node-done-then-gone $? 0
    wait "$pid1" 2>/dev/null
    # A node that never joins: node 0 waits --store-timeout for it, names it, starts no rank.
    D=$T timeout -k 5 30 "$RUN" --nnodes 2 --node-rank 0 -n 1 --store-timeout 1 \
        --rdzv-endpoint "127.0.0.1:$port" --rdzv-id nojoin \
        sh -c 'echo $$ > "$D/nojoin.r$RANK.pid"' >"$T/nojoin.out" 2>"$T/nojoin.err"
    expect_rc join-timeout $? 1
    expect_line join-timeout "$T/nojoin.err" \
        "c10drun: node(s) 1 did not join within 1 s (--store-timeout); not starting the ranks"
    if [ -e "$T/nojoin.r0.pid" ]; then fail "join-timeout: a rank was started"; else
        pass "join-timeout: no rank started"
    fi
    # The store's shared secret: c10drun's own client presents it (AUTH) on every node.
    for k in 0 1; do
        C10D_STORE_TOKEN=s3cret-$$ timeout -k 5 60 "$RUN" --nnodes 2 --node-rank $k -n 1 \
            --rdzv-endpoint "127.0.0.1:$port" --rdzv-id tokjob \
            sh -c 'echo "ok $RANK"' >"$T/tok$k.out" 2>"$T/tok$k.err" &
        eval "pid$k=\$!"
        BG+=($!)
    done
    wait "$pid1"
    expect_rc store-token-1 $? 0
    wait "$pid0"
    expect_rc store-token-0 $? 0
    expect_line store-token "$T/tok1.out" "[rank1]: ok 1"
else
    echo "SKIP: two nodes on one host (needs c10d-store and python3)"
fi

# A node whose node 0 does not resolve keeps trying, then fails within --store-timeout.
c10drun --nnodes 2 --node-rank 1 -n 1 --rdzv-endpoint no-such-host.invalid:29999 \
    --store-timeout 1 true >/dev/null 2>"$T/unres.err"
expect_rc node0-unresolved $? 1
expect_line node0-unresolved "$T/unres.err" \
    "c10drun: node 0's address no-such-host.invalid did not resolve within 1 s (--store-timeout)"

# ---------------------------------------------------------------- --max-restarts
# Rank 1 fails on the first attempt only; the second attempt succeeds.
restart_prog='echo "attempt $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 5; fi'
c10drun -n 2 --max-restarts 2 sh -c "$restart_prog" >"$T/rs.out" 2>"$T/rs.err"
expect_rc max-restarts $? 0
expect_line max-restarts "$T/rs.out" "[rank1]: attempt 0 of 2"
expect_line max-restarts "$T/rs.out" "[rank1]: attempt 1 of 2"
expect_line max-restarts "$T/rs.out" "[rank0]: attempt 1 of 2"
expect_no_match max-restarts "$T/rs.out" 'attempt 2'
expect_match max-restarts "$T/rs.err" '^c10drun: rank 1 \(pid [0-9]+\) exited with status 5$'
expect_line max-restarts "$T/rs.err" "c10drun: restarting the ranks: attempt 1 of at most 2 restarts"
# Every attempt fails: the last failure is the job's.
c10drun -n 2 --max-restarts 1 sh -c '[ "$RANK" = 0 ] || exit 6' >"$T/rs2.out" 2>"$T/rs2.err"
expect_rc max-restarts-spent $? 6
n=$(grep -c 'exited with status 6' "$T/rs2.err")
if [ "$n" = 2 ]; then pass "max-restarts-spent: 2 attempts failed"; else fail "max-restarts-spent: $n failure lines"; fi
if [ -n "$store_bin" ] && [ -n "$BUILD" ] && [ -x "$BUILD/examples/ddp_tiny" ]; then
    # The store is c10drun's: between attempts it drops the last attempt's keys.
    c10drun -n 2 --store external --max-restarts 1 --failure-grace-ms 500 sh -c '
        if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi
        exec "$0" 20' "$BUILD/examples/ddp_tiny" >"$T/rs3.out" 2>"$T/rs3.err"
    expect_rc max-restarts-external $? 0
    expect_match max-restarts-external "$T/rs3.out" '^\[rank0\]: weights identical on all 2 ranks'
fi

# ---------------------------------------------------------------- --failure-grace-ms
# Rank 1 fails; rank 0 notices it only afterwards and reports it: with the grace period its
# line is printed, and it is not counted as the failure.
grace_prog='echo $$ > "$D/grace.r$RANK.pid"
if [ "$RANK" = 1 ]; then sleep 0.3; exit 4; fi
while kill -0 "$(cat "$D/grace.r1.pid" 2>/dev/null || echo $$)" 2>/dev/null; do sleep 0.05; done
echo "peer 1 died" >&2; exit 1'
D=$T c10drun -n 2 sh -c "$grace_prog" >"$T/grace.out" 2>"$T/grace.err"
expect_rc failure-grace $? 4
expect_line failure-grace "$T/grace.err" "[rank0]: peer 1 died"
n=$(grep -c '^c10drun: rank' "$T/grace.err")
if [ "$n" = 1 ]; then pass "failure-grace: one failure line"; else fail "failure-grace: $n failure lines"; fi
# A rank that does not exit by itself gets SIGTERM once the grace period is over.
start=$(date +%s%N)
c10drun -n 2 --failure-grace-ms 1000 sh -c '[ "$RANK" = 1 ] && exit 4; exec sleep 100' \
    >"$T/grace2.out" 2>"$T/grace2.err"
expect_rc failure-grace-term $? 4
ms=$((($(date +%s%N) - start) / 1000000))
if [ "$ms" -ge 1000 ] && [ "$ms" -lt 4000 ]; then pass "failure-grace-term: stopped after $ms ms"; else
    fail "failure-grace-term: took $ms ms, want 1000..4000"
fi
if [ -n "$BUILD" ] && [ -x "$BUILD/examples/ddp_tiny" ]; then
    # The library's own report: rank 1's ddp_tiny dies with rank 1; rank 0's all_reduce fails
    # and ddp_tiny says so before c10drun stops it.
    c10drun -n 2 sh -c 'if [ "$RANK" = 1 ]; then "$0" 1000000 & sleep 1; exit 9; fi; exec "$0" 1000000' \
        "$BUILD/examples/ddp_tiny" >"$T/grace3.out" 2>"$T/grace3.err"
    expect_rc failure-grace-ddp $? 9
    expect_match failure-grace-ddp "$T/grace3.err" '^\[rank0\]: ddp_tiny: .*rank 1'
fi

# ---------------------------------------------------------------- --log-dir, --tee, --redirects
L=$T/logs
c10drun -n 2 --log-dir "$L" --run-id logjob --tee 3 sh -c 'echo "out$RANK"; echo "err$RANK" >&2' \
    >"$T/tee.out" 2>"$T/tee.err"
expect_rc tee $? 0
for r in 0 1; do
    expect_line tee "$L/logjob/attempt_0/$r/stdout.log" "out$r"
    expect_line tee "$L/logjob/attempt_0/$r/stderr.log" "err$r"
    expect_line tee "$T/tee.out" "[rank$r]: out$r"
    expect_line tee "$T/tee.err" "[rank$r]: err$r"
done
# Per local rank: rank 0's stdout to its file only, rank 1's untouched.
c10drun -n 2 --log-dir "$L" --run-id redir --redirects 0:1 --no-prefix sh -c 'echo "out$RANK"; echo "err$RANK" >&2' \
    >"$T/redir.out" 2>"$T/redir.err"
expect_rc redirects $? 0
expect_line redirects "$L/redir/attempt_0/0/stdout.log" "out0"
expect_no_match redirects "$T/redir.out" '^out0$'
expect_line redirects "$T/redir.out" "out1"
expect_line redirects "$T/redir.err" "err0"
if [ ! -e "$L/redir/attempt_0/1" ] && [ ! -e "$L/redir/attempt_0/0/stderr.log" ]; then
    pass "redirects: no files for streams not named"
else fail "redirects: unexpected files: $(find "$L/redir")"; fi
# One directory per attempt.
c10drun -n 2 --log-dir "$L" --run-id rlog --redirects 3 --max-restarts 1 sh -c "$restart_prog" \
    >"$T/rlog.out" 2>&1
expect_rc log-attempts $? 0
expect_line log-attempts "$L/rlog/attempt_0/1/stdout.log" "attempt 0 of 1"
expect_line log-attempts "$L/rlog/attempt_1/1/stdout.log" "attempt 1 of 1"
expect_no_match log-attempts "$T/rlog.out" '\[rank.\]: attempt'
c10drun -n 1 --tee 3 true >/dev/null 2>"$T/teenodir.err"
expect_rc tee-no-dir $? 2
c10drun -n 1 --log-dir "$L" --tee 0:4 true >/dev/null 2>"$T/teebad.err"
expect_rc tee-bad $? 2

# ---------------------------------------------------------------- two nodes in network namespaces
if [ -n "$BUILD" ] && [ -x "$BUILD/examples/ddp_tiny" ]; then
    "$(dirname "$0")/test_c10drun_nodes.sh" "$RUN" "$BUILD/examples/ddp_tiny"
    rc=$?
    if [ $rc = 77 ]; then
        echo "SKIP: two nodes in network namespaces (see above)"
    elif [ $rc = 0 ]; then
        pass "two nodes in network namespaces"
    else fail "two nodes in network namespaces (test_c10drun_nodes.sh: $rc)"; fi
else
    echo "SKIP: two nodes in network namespaces: no ddp_tiny under ${BUILD:-<no build dir>}/examples"
fi

echo
if [ "$FAILS" = 0 ]; then
    echo "test_c10drun: all passed"
    exit 0
fi
echo "test_c10drun: $FAILS failure(s)"
exit 1
