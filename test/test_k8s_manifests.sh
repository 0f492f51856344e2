#!/bin/sh
# examples/k8s: every manifest is YAML Kubernetes can read (when python3 has
# the yaml module; else that part is skipped), and every environment
# variable the manifests set is one libc10d reads (engine/env.h, names and
# fallbacks): a misspelt or invented name would be ignored silently.
#   test_k8s_manifests.sh SOURCE_DIR
set -eu
src=$1
dir="$src/examples/k8s"
fail() {
    echo "examples/k8s: $*" >&2
    exit 1
}
ls "$dir"/*.yaml >/dev/null 2>&1 || fail "no manifests"

# The names the library reads: X(id, "NAME", "FALLBACK, FALLBACK2" or NULL, ...).
known=$(tr -d '\\\n' <"$src/engine/env.h" |
    grep -o 'X([A-Z0-9_]*, *"[A-Z0-9_]*", *\(NULL\|"[A-Z0-9_, ]*"\)' |
    sed 's/^X([A-Z0-9_]*, *//' | grep -o '[A-Z0-9_]*' | grep -v -e '^NULL$' -e '^$' | sort -u)
echo "$known" | grep -qx MASTER_ADDR || fail "could not read the names in engine/env.h"

if command -v python3 >/dev/null 2>&1 && python3 -c 'import yaml' 2>/dev/null; then
    # Parse, check each document's shape, and list the env names set.
    names=$(python3 - "$dir"/*.yaml <<'PY'
import sys, yaml
def walk(node, out):
    if isinstance(node, dict):
        for c in node.get("containers", []) or []:
            for e in c.get("env", []) or []:
                out.add(e["name"])
        for v in node.values():
            walk(v, out)
    elif isinstance(node, list):
        for v in node:
            walk(v, out)
names = set()
for path in sys.argv[1:]:
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not docs:
        sys.exit(f"{path}: no YAML documents")
    for d in docs:
        for key in ("apiVersion", "kind", "metadata", "spec"):
            if key not in d:
                sys.exit(f"{path}: a {d.get('kind', '?')} without {key}")
        if not d["metadata"].get("name"):
            sys.exit(f"{path}: a {d['kind']} without a name")
    walk(docs, names)
print("\n".join(sorted(names)))
PY
) || fail "a manifest does not parse (above)"
    echo "YAML: $(ls "$dir"/*.yaml | wc -l) files parse"
else
    echo "YAML: not parsed (no python3 yaml module); env names read by grep"
    names=$(grep -h -E '^[[:space:]]*- name: [A-Z][A-Z0-9_]*[[:space:]]*(#.*)?$' "$dir"/*.yaml |
        sed 's/^[[:space:]]*- name: \([A-Z0-9_]*\).*/\1/' | sort -u)
fi
[ -n "$names" ] || fail "no environment variables found"
for n in $names; do
    echo "$known" | grep -qx "$n" || fail "sets $n, which libc10d does not read (engine/env.h)"
done
echo "env: $(echo $names) - all read by libc10d"

# The Indexed Job gives each rank what env:// needs against an external store.
for n in RANK WORLD_SIZE MASTER_ADDR MASTER_PORT TORCHELASTIC_USE_AGENT_STORE; do
    grep -q "name: $n\([[:space:]]\|\$\)" "$dir/job.yaml" || fail "job.yaml does not set $n"
done
grep -q "batch.kubernetes.io/job-completion-index" "$dir/job.yaml" || fail "job.yaml: RANK is not the completion index"
grep -q 'completionMode: Indexed' "$dir/job.yaml" || fail "job.yaml is not an Indexed Job"
# Probes and commands name programs the image ships.
[ "$(grep -c '"c10d-store", "ping"' "$dir/store.yaml")" -ge 2 ] || fail "store.yaml: readiness and liveness are not c10d-store ping"
grep -q '/usr/local/bin/ddp_tiny' "$src/Dockerfile" || fail "the image does not ship ddp_tiny"
echo "k8s manifests: checks passed"
