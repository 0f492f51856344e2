#!/bin/sh
# No Docker engine runs here, so check what can be checked without one: the
# Dockerfile installs dependencies through the script CI runs, every file it
# copies exists, and that script accepts the modes the Dockerfile asks for.
set -eu
src=$1
df="$src/Dockerfile"
grep -q 'install-deps.sh build' "$df" || { echo "Dockerfile does not build with scripts/install-deps.sh build"; exit 1; }
grep -q 'install-deps.sh runtime' "$df" || { echo "Dockerfile runtime stage does not use scripts/install-deps.sh"; exit 1; }
grep -q -- '--from=build' "$df" || { echo "Dockerfile is not multi-stage"; exit 1; }
grep '^COPY ' "$df" | grep -v -- '--from' | awk '{print $2}' | while read -r f; do
    [ "$f" = . ] || [ -e "$src/$f" ] || { echo "Dockerfile copies missing $f"; exit 1; }
done
sh -n "$src/scripts/install-deps.sh"
for mode in build runtime test bench; do
    grep -q "^$mode)" "$src/scripts/install-deps.sh" || { echo "install-deps.sh has no $mode mode"; exit 1; }
done
# The build stage's targets exist in this CMake project.
grep -q 'install(TARGETS c10d-store' "$src/store_server/CMakeLists.txt" || { echo "c10d-store is not installed by CMake"; exit 1; }
echo "Dockerfile checks passed"
