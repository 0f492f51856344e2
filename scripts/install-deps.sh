#!/bin/sh
# Installs the Debian/Ubuntu packages libc10d needs, and nothing that is
# already there. Used by the README's commands, .ci/run and the Dockerfile
# (one recipe, so they cannot drift).
#   scripts/install-deps.sh build     compiler, CMake, libuv, jansson
#   scripts/install-deps.sh test      + cmocka, PyTorch 1.13 (interop), clang (fuzzing)
#   scripts/install-deps.sh bench     + Open MPI and iperf3 (peer comparison)
#   scripts/install-deps.sh runtime   shared libraries only (the runtime image)
#   scripts/install-deps.sh container buildah and debootstrap (test_container builds the image)
#   scripts/install-deps.sh launchers Open MPI, Slurm and munge (the real-launcher tests)
set -eu

want=${1:-build}
build_pkgs="build-essential cmake pkg-config libuv1-dev libjansson-dev"
case "$want" in
runtime) pkgs="libuv1|libuv1t64 libjansson4" ;; # Ubuntu 24.04 renamed libuv1 (t64)
container) pkgs="buildah debootstrap" ;;
launchers) pkgs="openmpi-bin slurm-wlm munge" ;;
build) pkgs="$build_pkgs" ;;
test) pkgs="$build_pkgs libcmocka-dev python3-torch clang libclang-rt-dev procps iproute2 iptables" ;;
bench) pkgs="$build_pkgs python3-torch openmpi-bin libopenmpi-dev iperf3" ;;
*)
    echo "usage: $0 build|test|bench|runtime|launchers|container" >&2
    exit 2
    ;;
esac

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }

# "a|b": whichever of the alternatives is installed, else the first one the
# archive offers.
missing=""
for alts in $pkgs; do
    have=""
    for p in $(echo "$alts" | tr '|' ' '); do
        installed "$p" && have=$p && break
    done
    [ -n "$have" ] || missing="$missing $alts"
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
export DEBIAN_FRONTEND=noninteractive
# A fresh machine or image may have no package lists yet.
ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || $SUDO apt-get update
choose() {
    for p in $(echo "$1" | tr '|' ' '); do
        apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]' && { echo "$p"; return; }
    done
    echo "${1%%|*}"
}
chosen=""
for alts in $missing; do
    chosen="$chosen $(choose "$alts")"
done
echo "install-deps: installing$chosen"
$SUDO apt-get install -y --no-install-recommends $chosen ||
    { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $chosen; }
