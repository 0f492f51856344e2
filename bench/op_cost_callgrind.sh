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
. "$(dirname "$0")/callgrind_rank0.sh"
callgrind_rank0
callgrind_annotate --inclusive=yes "$out/cg.out" 2>/dev/null | awk -v n=$nops '
    /:c10d_all_reduce( |$)/ && submit == 0 { gsub(",", "", $1); submit = $1 / n }
    /:c10d_work_wait_release( |$)/ && wait == 0 { gsub(",", "", $1); wait = $1 / n }
    END {
        if (submit == 0) { print "op_cost_callgrind: no counts (did the job run?)"; exit 1 }
        printf "%d B all_reduce, 2 ranks: %.0f instructions per op (submit %.0f, wait %.0f)\n",
               '"$bytes"', submit + wait, submit, wait
    }'
