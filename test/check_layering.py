#!/usr/bin/env python3
"""Checks the library's arrows against docs/architecture.md.

Every quoted #include in the library and tools (api/, backends/, engine/,
gpu/, store_server/, tools/) must either stay inside its module or follow an arrow
the architecture page allows; the public header include/c10d.h may be included
from anywhere. The allowed arrows must form no cycle. Every header's guard
names its file (C10D_<PATH>; the public header keeps C10D_H).

With object files it also checks calls, not only includes: a symbol an object
of module A uses that an object of module B defines needs the arrow A -> B
(so a call through a prototype in the public header is seen too), and no two
object files anywhere in the library and tools call each other around a loop
(inside a module, files are floors too). An object's module is its source path (CMake puts
the object of src/x.c at .../<target>.dir/src/x.c.o, src relative to the
folder whose CMakeLists.txt made the target: FOLDER=DIR says so for DIR).

  check_layering.py SOURCE_DIR [[FOLDER=]OBJECT_FILE_OR_DIR...]
  check_layering.py --self-test     # proves the checks fail on a wrong-way call
"""
import os
import re
import subprocess
import sys

ROOTS = ("api", "backends", "engine", "gpu", "store_server", "tools")
# Object files must not call each other around a loop, in every folder.
CYCLE_FREE = tuple(root + "/" for root in ROOTS)


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


def tree_files(src, roots, suffixes):
    """Paths (relative to src) of the files under `roots` ending in `suffixes`, sorted."""
    files = []
    for root in roots:
        for dirpath, _, names in os.walk(os.path.join(src, root)):
            files += [os.path.relpath(os.path.join(dirpath, n), src) for n in names
                      if n.endswith(suffixes)]
    return sorted(files)


def check_includes(src, arrows):
    modules = set(arrows)
    problems = []
    files = tree_files(src, ROOTS, (".c", ".h"))
    for f in files:
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
            elif os.path.exists(os.path.join(src, "include", inc)):
                target = os.path.join("include", inc)
            else:
                problems.append(f"{f}:{lineno}: #include \"{inc}\" names no file of the tree")
                continue
            if target == "include/c10d.h":
                continue
            tmod = module_of(target, modules)
            if tmod == mod:
                continue
            if tmod not in arrows.get(mod, set()):
                problems.append(f"{f}:{lineno}: {mod} -> {tmod} (#include \"{inc}\") is not an "
                                "allowed arrow")
    return problems, len(files)


def check_guards(src):
    problems = []
    for f in tree_files(src, ROOTS + ("include", "test"), (".h",)):
        text = open(os.path.join(src, f), encoding="utf-8").read()
        m = re.search(r"#ifndef\s+(\w+)\s*\n#define\s+(\w+)", text)
        want = "C10D_H" if f == "include/c10d.h" else \
            "C10D_" + re.sub(r"[^A-Za-z0-9]", "_", f).upper()
        if m is None or m.group(1) != want or m.group(2) != want:
            problems.append(f"{f}: header guard should be {want}")
    return problems


LONG_LINES = 800


def check_long_files(src):
    """A library source over LONG_LINES lines says why in its opening comment."""
    problems = []
    for f in tree_files(src, ROOTS, (".c",)):
        text = open(os.path.join(src, f), encoding="utf-8").read()
        if text.count("\n") <= LONG_LINES:
            continue
        opening = re.sub(r"\n\s*\*", " ", text.split("*/", 1)[0])
        if f"Over {LONG_LINES} lines" not in " ".join(opening.split()):
            problems.append(f"{f}: {text.count(chr(10))} lines, and its opening comment "
                            f"does not say why (\"Over {LONG_LINES} lines because ...\")")
    return problems


def source_of(obj, folder=""):
    """The source path (relative to the tree) an object file was built from."""
    m = re.search(r"\.dir/(.+)\.o$", obj.replace(os.sep, "/"))
    if m is None:
        return None
    return os.path.normpath(os.path.join(folder, m.group(1))) if folder else m.group(1)


def check_objects(paths, arrows=None):
    """Calls that follow no allowed arrow; object files calling each other around a loop."""
    objs = []
    folder_of = {}
    for p in paths:
        folder, _, p = p.rpartition("=")
        found = []
        if os.path.isdir(p):
            for dirpath, _, names in os.walk(p):
                found += [os.path.join(dirpath, n) for n in names if n.endswith(".o")]
        else:
            found.append(p)
        for o in found:
            folder_of[o] = folder
        objs += found
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
    # Inside a module too, files form floors: a lower one reports upward
    # through callbacks the upper one installs, never by name.
    def checked(o):
        rel = source_of(o, folder_of[o]) or os.path.relpath(o, objdir)
        return rel.startswith(CYCLE_FREE)

    problems = []
    if arrows is not None:
        modules = set(arrows)
        seen = set()
        for o in objs:
            src = source_of(o, folder_of[o])
            mod = module_of(src, modules) if src else None
            if mod is None:
                continue
            for sym in sorted(needed[o]):
                d = defined.get(sym)
                dsrc = source_of(d, folder_of[d]) if d else None
                dmod = module_of(dsrc, modules) if dsrc else None
                if dmod is None or dmod == mod or dmod in arrows.get(mod, set()):
                    continue
                if (mod, dmod) in seen:
                    continue
                seen.add((mod, dmod))
                problems.append(f"{src} calls {sym} of {dsrc}: {mod} -> {dmod} is not an "
                                "allowed arrow")
    graph = {o: {defined[s] for s in needed[o] if s in defined and defined[s] != o and checked(defined[s])}
             for o in objs if checked(o)}
    cycle = find_cycle(graph)
    if cycle is not None:
        names = [os.path.relpath(c, objdir) for c in cycle]
        problems.append("object files call each other: " + " -> ".join(names))
    return problems, len(objs)


def self_test():
    """Builds two tiny objects where the engine calls into the group layer, in
    a tree laid out as CMake lays out objects, and expects both checks to say so."""
    import tempfile
    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as tmp:
        objs = []
        for path, code in (("engine/low.c", "int c10d__api_thing(void); int c10d__engine_thing(void) { return c10d__api_thing(); }\n"),
                           ("api/high.c", "int c10d__engine_thing(void); int c10d__api_thing(void) { return 1; }\nint c10d__use(void) { return c10d__engine_thing(); }\n")):
            srcf = os.path.join(tmp, "src", path)
            os.makedirs(os.path.dirname(srcf), exist_ok=True)
            open(srcf, "w").write(code)
            obj = os.path.join(tmp, "obj", "x.dir", path + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            subprocess.run([cc, "-c", srcf, "-o", obj], check=True)
            objs.append(obj)
        arrows = {"engine": set(), "api": {"engine"}}
        problems, _ = check_objects(objs, arrows)
        wrong_way = [p for p in problems if "engine -> api is not an allowed arrow" in p]
        loop = [p for p in problems if "call each other" in p]
        if not wrong_way or not loop:
            print("self-test: the check missed an injected wrong-way call:", problems)
            return 1
        allowed, _ = check_objects([objs[1]], arrows)
        if allowed:
            print("self-test: an allowed call was reported:", allowed)
            return 1
    print("self-test: a wrong-way call and a loop are both caught")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    src = sys.argv[1]
    arrows = allowed_arrows(os.path.join(src, "docs", "architecture.md"))
    problems = []
    cycle = find_cycle(arrows)
    if cycle:
        problems.append("the allowed arrows form a cycle: " + " -> ".join(cycle))
    inc_problems, nfiles = check_includes(src, arrows)
    problems += inc_problems
    problems += check_guards(src)
    problems += check_long_files(src)
    nobjs = 0
    if len(sys.argv) > 2:
        obj_problems, nobjs = check_objects(sys.argv[2:], arrows)
        problems += obj_problems
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{nfiles} files, {len(arrows)} modules, {nobjs} objects: every arrow allowed, no cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
