#!/bin/sh
# Installs the Debian/Ubuntu packages libc10d needs, and nothing that is
# already there. Used by the README's commands, .ci/run and the Dockerfile
# (one recipe, so they cannot drift).
#   scripts/install-deps.sh build     compiler, CMake, libuv, jansson
#   scripts/install-deps.sh test      + cmocka, PyTorch 1.13 (interop), clang (fuzzing)
#   scripts/install-deps.sh bench     + Open MPI and iperf3 (peer comparison)
#   scripts/install-deps.sh runtime   shared libraries only (the runtime image)
set -eu

want=${1:-build}
build_pkgs="build-essential cmake pkg-config libuv1-dev libjansson-dev"
case "$want" in
runtime) pkgs="libuv1 libjansson4" ;;
build) pkgs="$build_pkgs" ;;
test) pkgs="$build_pkgs libcmocka-dev python3-torch clang libclang-rt-dev procps iproute2" ;;
bench) pkgs="$build_pkgs python3-torch openmpi-bin libopenmpi-dev iperf3" ;;
*)
    echo "usage: $0 build|test|bench|runtime" >&2
    exit 2
    ;;
esac

missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "install-deps: missing packages:$missing (run as root to install them)" >&2
        exit 1
    fi
else
    SUDO=
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; refresh once on failure.
$SUDO apt-get install -y --no-install-recommends $missing ||
    { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $missing; }
