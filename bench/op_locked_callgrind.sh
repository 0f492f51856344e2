#!/bin/sh
# Locked instructions per op of a small collective on the caller's thread:
# rank 0 of a 2-rank c10d-bench runs under callgrind with --dump-instr=yes,
# and every executed instruction that locks (a `lock` prefix, an `xchg` with
# memory, `mfence`) is counted from objdump's listing of the binary and the
# libraries it ran in, per op and per function. Each one waits for the
# thread's earlier stores to reach the cache; a locked add alone is about
# 2 ns on this VM, more after stores that miss (bench/README.md, "Fewer
# locked instructions").
#
#   bench/op_locked_callgrind.sh BUILD_DIR [BYTES] [OPS]     (default 4, 10000)
set -eu
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
. "$(dirname "$0")/callgrind_rank0.sh"
callgrind_rank0 --dump-instr=yes
/usr/bin/python3 - "$out/cg.out" $nops <<'PY'
import collections, re, subprocess, sys

path, nops = sys.argv[1], int(sys.argv[2])
names = {}
counts = collections.Counter()  # (object, address) -> executions
obj, last, after_call = None, 0, False


def position(tok, last):
    if tok == '*':
        return last
    if tok[0] in '+-':
        return last + int(tok, 0)
    return int(tok, 0)


for line in open(path):
    line = line.rstrip('\n')
    m = re.match(r'(c?ob)=\((\d+)\)(?: (.*))?$', line)
    if m:
        if m.group(3):
            names[m.group(2)] = m.group(3)
        if m.group(1) == 'ob':
            obj = names[m.group(2)]
        continue
    if line.startswith('calls='):
        after_call = True  # the next cost line is the call's inclusive cost
        continue
    if line[:1] and line[0] in '0123456789+-*':
        parts = line.split()
        last = position(parts[0], last)
        if after_call:
            after_call = False
        elif len(parts) >= 3:
            counts[(obj, last)] += int(parts[2])

locking = re.compile(r'lock|mfence|xchg\s+\S*\(|xchg\s+%\w+,\S*\(')
per_fn, total = collections.Counter(), 0
for o in sorted({o for o, _ in counts if o and o.startswith('/')}):
    listing = subprocess.run(['objdump', '-d', '--no-show-raw-insn', o],
                             capture_output=True, text=True).stdout
    fn = None
    for text in listing.split('\n'):
        m = re.match(r'^[0-9a-f]+ <(.*)>:', text)
        if m:
            fn = m.group(1)
            continue
        m = re.match(r'^\s+([0-9a-f]+):\s+(.*)$', text)
        if m and locking.match(m.group(2)):
            n = counts.get((o, int(m.group(1), 16)), 0)
            total += n
            per_fn[fn] += n
if total == 0:
    sys.exit('op_locked_callgrind: no counts (did the job run?)')
print('all_reduce, 2 ranks: %.1f locked instructions per op' % (total / nops))
for fn, n in per_fn.most_common():
    if n / nops >= 0.5:
        print('  %5.1f  %s' % (n / nops, fn))
PY
