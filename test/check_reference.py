#!/usr/bin/env python3
"""docs/reference.md names every exported function, and no doc calls one the
header does not declare.

  check_reference.py SOURCE_DIR LIBC10D_SO

1. Every c10d_* symbol the shared library exports appears in docs/reference.md.
2. Every call-like c10d_name( in README.md and docs/*.md is a function declared
   in include/c10d.h, or one docs/reference.md lists under "Removed in".
"""
import os
import re
import subprocess
import sys


def main():
    src, lib = sys.argv[1], sys.argv[2]
    out = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                         check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("c10d_")}
    header = open(os.path.join(src, "include", "c10d.h"), encoding="utf-8").read()
    declared = set(re.findall(r"C10D_EXPORT[^;(]*?\b(c10d_[a-z0-9_]+)\s*\(", header))
    ref = open(os.path.join(src, "docs", "reference.md"), encoding="utf-8").read()
    removed_part = ref.split("## Removed in", 1)[1] if "## Removed in" in ref else ""
    removed = set(re.findall(r"\bc10d_[a-z0-9_]+", removed_part))
    named = set(re.findall(r"\bc10d_[a-z0-9_]+", ref.split("## Removed in", 1)[0]))
    problems = [f"docs/reference.md: exported {f} is not listed" for f in sorted(exported - named)]
    problems += [f"include/c10d.h declares {f}, which the library does not export"
                 for f in sorted(declared - exported)]
    docs = [os.path.join(src, "README.md")]
    docs += [os.path.join(src, "docs", n) for n in sorted(os.listdir(os.path.join(src, "docs")))
             if n.endswith(".md")]
    for path in docs:
        for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
            for name in re.findall(r"\b(c10d_[a-z][a-z0-9_]*)\(", line):
                if name not in declared and name not in removed:
                    problems.append(f"{os.path.relpath(path, src)}:{lineno}: {name}() is not "
                                    "declared in include/c10d.h")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{len(exported)} exported functions, all in docs/reference.md; "
          f"{len(docs)} docs call only declared functions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
