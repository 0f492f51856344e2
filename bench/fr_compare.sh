#!/bin/sh
# The flight recorder on (2000 entries) and off (0), alternating, 2-rank
# blocking all_reduce on tcp, 4 B and 4 KiB: "rep R buf N size S time_us T".
# Usage: bench/fr_compare.sh [BUILD_DIR]
b=${1:-build}
for rep in 1 2 3 4 5 6 7 8 9; do
  for sz in 4 4096; do
    for n in 2000 0; do
      C10D_TRACE_BUFFER_SIZE=$n $b/tools/c10drun/c10drun -n 2 --bind-to core --no-prefix \
        $b/bench/c10d-bench -o all_reduce -b $sz -e $sz -n 20000 -w 2000 -z 1 -c 0 2>/dev/null \
        | awk -v n=$n -v r=$rep '$1 ~ /^[0-9]+$/ && NF >= 9 {print "rep", r, "buf", n, "size", $1, "time_us", $6; exit}'
    done
  done
done
