#!/bin/sh
# Instructions per op of a small collective on the caller's thread, under
# valgrind --tool=callgrind: rank 0 of a 2-rank c10d-bench runs under
# callgrind, rank 1 at full speed, and the inclusive counts of the calls a
# blocking op is made of (c10d_all_reduce, c10d_work_wait_release) are divided
# by the ops run. Times on a shared VM move 50% between minutes; this count
# does not, on an otherwise idle machine (a waiter's polls count too when
# rank 1 lags) (bench/README.md, "Per-op cost of a small collective").
#
#   bench/op_cost_callgrind.sh BUILD_DIR [BYTES] [OPS]     (default 4, 10000)
set -eu
[ $# -ge 1 ] || { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
build=$1
bytes=${2:-4}
ops=${3:-10000}
warmup=100
command -v valgrind >/dev/null || { echo "op_cost_callgrind: valgrind not installed" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT INT TERM
bench=$(realpath "$build/bench/c10d-bench")
args="-o all_reduce -b $bytes -e $bytes -n $ops -w $warmup -z 1 -c 0"
"$build/tools/c10drun/c10drun" -n 2 sh -c "if [ \$RANK = 0 ]; then exec valgrind --tool=callgrind \
--callgrind-out-file=$out/cg.out $bench $args; else exec $bench $args; fi" >/dev/null 2>&1
callgrind_annotate --inclusive=yes "$out/cg.out" 2>/dev/null | awk -v n=$((ops + warmup)) '
    /:c10d_all_reduce( |$)/ && submit == 0 { gsub(",", "", $1); submit = $1 / n }
    /:c10d_work_wait_release( |$)/ && wait == 0 { gsub(",", "", $1); wait = $1 / n }
    END {
        if (submit == 0) { print "op_cost_callgrind: no counts (did the job run?)"; exit 1 }
        printf "%d B all_reduce, 2 ranks: %.0f instructions per op (submit %.0f, wait %.0f)\n",
               '"$bytes"', submit + wait, submit, wait
    }'
