#!/usr/bin/env python3
"""Checks the library's include arrows against docs/architecture.md.

Every quoted #include in the library and tools (api/, backends/, engine/,
store_server/, tools/) must either stay inside its module or follow an arrow
the architecture page allows; the public header api/c10d.h may be included
from anywhere. The allowed arrows must form no cycle. With an object
directory, it also checks that no two object files of the library call each
other (directly or around a loop), from their defined and undefined symbols.

  check_layering.py SOURCE_DIR [OBJECT_FILE_OR_DIR...]
"""
import os
import re
import subprocess
import sys

ROOTS = ("api", "backends", "engine", "store_server", "tools")
# Folders whose object files must not call each other around a loop.
CYCLE_FREE = ("engine/", "api/", "backends/op_kind", "backends/registry", "store_server/wire/",
              "store_server/table/")


def allowed_arrows(doc_path):
    """Reads the ```layering block: lines "module -> dep, dep" (or "-> nothing")."""
    text = open(doc_path, encoding="utf-8").read()
    m = re.search(r"```layering\n(.*?)```", text, re.S)
    if m is None:
        sys.exit(f"{doc_path}: no ```layering block")
    arrows = {}
    for line in m.group(1).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        src, _, deps = line.partition("->")
        deps = [d.strip() for d in deps.split(",") if d.strip() and d.strip() != "nothing"]
        arrows[src.strip()] = set(deps)
    return arrows


def module_of(path, modules):
    best = None
    for mod in modules:
        if path == mod or path.startswith(mod + "/"):
            if best is None or len(mod) > len(best):
                best = mod
    return best


def find_cycle(graph):
    """Returns one cycle as a list of nodes, or None."""
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def check_includes(src, arrows):
    modules = set(arrows)
    problems = []
    files = []
    for root in ROOTS:
        for dirpath, _, names in os.walk(os.path.join(src, root)):
            for name in names:
                if name.endswith((".c", ".h")):
                    files.append(os.path.relpath(os.path.join(dirpath, name), src))
    for f in sorted(files):
        mod = module_of(f, modules)
        if mod is None:
            problems.append(f"{f}: in no module of docs/architecture.md's layering block")
            continue
        for lineno, line in enumerate(open(os.path.join(src, f), encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            inc = m.group(1)
            here = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if os.path.exists(os.path.join(src, here)):
                target = here
            elif os.path.exists(os.path.join(src, inc)):
                target = inc
            elif os.path.exists(os.path.join(src, "api", inc)):
                target = os.path.join("api", inc)
            else:
                problems.append(f"{f}:{lineno}: #include \"{inc}\" names no file of the tree")
                continue
            if target == "api/c10d.h":
                continue
            tmod = module_of(target, modules)
            if tmod == mod:
                continue
            if tmod not in arrows.get(mod, set()):
                problems.append(f"{f}:{lineno}: {mod} -> {tmod} (#include \"{inc}\") is not an "
                                "allowed arrow")
    return problems, len(files)


def check_objects(paths):
    """Object files that call each other around a loop."""
    objs = []
    for p in paths:
        if os.path.isdir(p):
            for dirpath, _, names in os.walk(p):
                objs += [os.path.join(dirpath, n) for n in names if n.endswith(".o")]
        else:
            objs.append(p)
    objdir = os.path.commonpath(objs) if objs else "."
    defined, needed = {}, {}
    for o in objs:
        out = subprocess.run(["nm", "-g", o], capture_output=True, text=True, check=True).stdout
        needed[o] = set()
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                needed[o].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRV":
                defined[parts[2]] = o
    # The files of one transport or one store may call each other; the engine
    # base and the group layer must stay one-way inside too.
    def checked(o):
        rel = os.path.relpath(o, objdir)
        return rel.startswith(CYCLE_FREE)

    graph = {o: {defined[s] for s in needed[o] if s in defined and defined[s] != o and checked(defined[s])}
             for o in objs if checked(o)}
    cycle = find_cycle(graph)
    if cycle is None:
        return [], len(objs)
    names = [os.path.relpath(c, objdir) for c in cycle]
    return ["object files call each other: " + " -> ".join(names)], len(objs)


def main():
    src = sys.argv[1]
    arrows = allowed_arrows(os.path.join(src, "docs", "architecture.md"))
    problems = []
    cycle = find_cycle(arrows)
    if cycle:
        problems.append("the allowed arrows form a cycle: " + " -> ".join(cycle))
    inc_problems, nfiles = check_includes(src, arrows)
    problems += inc_problems
    nobjs = 0
    if len(sys.argv) > 2:
        obj_problems, nobjs = check_objects(sys.argv[2:])
        problems += obj_problems
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{nfiles} files, {len(arrows)} modules, {nobjs} objects: every arrow allowed, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
