#!/bin/sh
# The container image, built and run (Dockerfile, docs/deploy.md):
#   test_container.sh SOURCE_DIR
# 1. Always: static checks of the Dockerfile (fully qualified base images, the
#    packages from scripts/install-deps.sh, LD_LIBRARY_PATH left alone, a
#    numeric non-root user, a health check by `c10d-store ping`, a build
#    context without build trees).
# 2. As root with buildah and debootstrap (else exit 77, saying why): builds
#    the CPU image with `buildah bud --isolation chroot` FROM a Debian 12
#    minbase made here by debootstrap from this machine's own Debian mirror,
#    then from that image runs the store, checks it with `c10d-store ping`,
#    runs a 2-rank ddp_tiny job against it (RANK/WORLD_SIZE/MASTER_* as a
#    Kubernetes Job gives them) and a 2-rank `c10drun` job.
# The debootstrap base is made once and kept (a tar under C10D_CONTAINER_CACHE,
# default /var/tmp/c10d-container-cache, and the image localhost/c10d-test-base
# in container storage), keyed by suite, variant and mirror; the image build
# keeps its layers (--layers), so a warm run redoes only what the source
# changed: the compile and the runtime stage's last steps.
#   C10D_TEST_CONTAINER=0     skip part 2
#   C10D_DEBIAN_MIRROR=URL    mirror for debootstrap (default: from /etc/apt)
set -eu
src=$(cd "$1" && pwd)
df="$src/Dockerfile"

# ------------------------------------------------------------------ 1. static
bad() {
    echo "Dockerfile: $*" >&2
    exit 1
}
grep -q 'install-deps.sh build' "$df" || bad "the build stage does not use scripts/install-deps.sh build"
grep -q 'install-deps.sh runtime' "$df" || bad "the runtime stage does not use scripts/install-deps.sh runtime"
grep -q -- '--from=build' "$df" || bad "not multi-stage"
# Every FROM names an ARG, and every image ARG's default is fully qualified
# (registry host with a dot, then a path): podman and buildah refuse short names.
grep '^FROM ' "$df" | grep -qv '^FROM \${[A-Z_]*}' && bad "a FROM names an image directly: use ARG BASE_IMAGE/BUILD_IMAGE"
grep '^ARG [A-Z_]*IMAGE=' "$df" | while IFS='=' read -r _ image; do
    case $image in
    *.*/*/*) ;;
    *) bad "base image '$image' is not fully qualified (registry/namespace/name)" ;;
    esac
done
grep -q 'C10D_WITH_NCCL' "$df" && bad "passes C10D_WITH_NCCL (the GPU backend is always built)"
# The base image's LD_LIBRARY_PATH (CUDA's) must survive.
if grep -E '^(ENV|[[:space:]]).*LD_LIBRARY_PATH=' "$df" | grep -qv 'LD_LIBRARY_PATH:+'; then
    bad "sets LD_LIBRARY_PATH without keeping the base image's value"
fi
grep -q '^HEALTHCHECK .*' "$df" || bad "no HEALTHCHECK"
grep -A2 '^HEALTHCHECK' "$df" | grep -q '"c10d-store", "ping"' || bad "HEALTHCHECK is not c10d-store ping"
user=$(sed -n 's/^USER \([0-9]*\).*/\1/p' "$df" | tail -n 1)
[ -n "$user" ] && [ "$user" -ne 0 ] || bad "the last USER is not a numeric non-root user"
grep -q '^EXPOSE 29500' "$df" || bad "does not EXPOSE the store port"
for f in .git 'build\*/'; do
    grep -qx "$f" "$src/.dockerignore" || { echo ".dockerignore does not exclude $f" >&2; exit 1; }
done
grep '^COPY ' "$df" | grep -v -- '--from' | awk '{print $2}' | while read -r f; do
    [ "$f" = . ] || [ -e "$src/$f" ] || bad "copies missing $f"
done
sh -n "$src/scripts/install-deps.sh"
# The Dockerfile runs it directly.
[ -x "$src/scripts/install-deps.sh" ] || bad "scripts/install-deps.sh is not executable"
for mode in build runtime; do
    grep -q "^$mode)" "$src/scripts/install-deps.sh" || { echo "install-deps.sh has no $mode mode" >&2; exit 1; }
done
for t in c10d-store c10drun c10d-fr c10d-bench; do
    grep -rqs "install(TARGETS $t" "$src/store_server" "$src/tools" "$src/bench" ||
        bad "$t is not installed by CMake"
done
echo "Dockerfile: static checks passed"

# ------------------------------------------------------------- 2. build, run
skip() {
    echo "SKIP: $*"
    exit 77
}
[ "${C10D_TEST_CONTAINER:-1}" != 0 ] || skip "C10D_TEST_CONTAINER=0"
[ "$(id -u)" -eq 0 ] || skip "building the image needs root (buildah --isolation chroot, debootstrap)"
for tool in buildah debootstrap tar sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || skip "no $tool (scripts/install-deps.sh container)"
done

# The mirror this machine's apt uses (deb822 .sources, else one-line .list).
apt_mirror() {
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] && awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) {print $i; break}}' "$f"
    done
}
mirror=${C10D_DEBIAN_MIRROR:-$(apt_mirror | grep -v -e security -e '^cdrom:' | grep '/debian/*$' | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}
suite=bookworm
cache=${C10D_CONTAINER_CACHE:-/var/tmp/c10d-container-cache}
key=$(printf '%s minbase %s v2' "$suite" "$mirror" | sha256sum | cut -c1-12)
base=localhost/c10d-test-base:$suite-$key
image=localhost/c10d-test:latest
mkdir -p "$cache"
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }

if buildah inspect --type image "$base" >/dev/null 2>&1; then
    stamp "base image $base: cached"
else
    tarball=$cache/$suite-minbase-$key.tar
    if [ ! -s "$tarball" ]; then
        stamp "debootstrap --variant=minbase $suite from $mirror"
        root=$cache/rootfs.$$
        rm -rf "$root"
        if ! debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$cache/debootstrap.log" 2>&1; then
            tail -n 20 "$cache/debootstrap.log"
            rm -rf "$root"
            skip "debootstrap from $mirror failed (offline?), log: $cache/debootstrap.log"
        fi
        # As the registry's slim images: no package lists, no downloaded .debs.
        rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
        tar -C "$root" --numeric-owner -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
    fi
    stamp "importing $tarball as $base"
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tarball" / >/dev/null
    buildah config --cmd /bin/bash "$ctr"
    buildah commit --quiet --rm "$ctr" "$base" >/dev/null
fi

# The image, as a user builds it (docker format: OCI images drop HEALTHCHECK).
old=$(buildah inspect --type image --format '{{.FromImageID}}' "$image" 2>/dev/null || true)
stale=$(buildah images -q --filter dangling=true --filter since="$base" 2>/dev/null || true)
stamp "buildah bud --isolation chroot --layers (BASE_IMAGE=BUILD_IMAGE=$base)"
buildah bud --isolation chroot --layers --format docker --quiet \
    --build-arg BASE_IMAGE="$base" --build-arg BUILD_IMAGE="$base" \
    -t "$image" -f "$df" "$src" >"$cache/bud.log" 2>&1 || {
    tail -n 40 "$cache/bud.log"
    echo "image build failed (log: $cache/bud.log)" >&2
    exit 1
}
new=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
# The previous test image and the previous build's leftover stages go; layers
# this build used (the package installs) have children now and stay cached.
[ -z "$old" ] || [ "$old" = "$new" ] || buildah rmi "$old" >/dev/null 2>&1 || true
for id in $stale; do
    buildah rmi "$id" >/dev/null 2>&1 || true
done
stamp "built $image"

# Its configuration: the health check, the user, the environment.
cfg() { buildah inspect --type image --format "{{.Docker.Config.$1}}" "$image"; }
cfg Healthcheck | grep -q '^{\[CMD c10d-store ping ' || bad "the image has no c10d-store ping health check: $(cfg Healthcheck)"
[ "$(cfg User)" = 10001:10001 ] || bad "the image does not run as 10001: $(cfg User)"
cfg Env | grep -q LD_LIBRARY_PATH && bad "the image sets LD_LIBRARY_PATH: $(cfg Env)"
cfg ExposedPorts | grep -q 29500/tcp || bad "the image does not expose 29500: $(cfg ExposedPorts)"

ctr=$(buildah from --quiet "$image")
in_image() { buildah run --isolation chroot "$@"; }
# The chroot shares this host's PID namespace: the pid the store's wrapper
# writes is the one to stop (`timeout` passes SIGTERM on to the store).
cleanup() {
    pid=$(in_image "$ctr" -- cat /tmp/store.pid 2>/dev/null || true)
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    [ -z "${bg:-}" ] || wait "$bg" 2>/dev/null || true
    buildah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Who the image runs as, and what it ships.
in_image "$ctr" -- sh -c '[ "$(id -u)" = 10001 ] || { echo "runs as $(id -u)"; exit 1; }
    for p in c10d-store c10drun c10d-fr c10d-bench ddp_tiny; do command -v "$p" >/dev/null ||
        { echo "no $p on PATH"; exit 1; }; done' || bad "the image's user or programs are wrong"

# The store, on a free port of loopback (the chroot shares this host's network).
in_image "$ctr" -- sh -c 'echo $$ >/tmp/store.pid; exec timeout 600 c10d-store serve \
    --host 127.0.0.1 --port 0 --port-file /tmp/store.port --stats-interval-s 0' \
    >"$cache/store.log" 2>&1 &
bg=$!
port=
for _ in $(seq 1 100); do
    port=$(in_image "$ctr" -- cat /tmp/store.port 2>/dev/null || true)
    [ -n "$port" ] && break
    sleep 0.2
done
[ -n "$port" ] || { cat "$cache/store.log"; bad "the store in the image did not start"; }
stamp "store in the image on port $port"
# The image's own health check, pointed at that port.
check=$(cfg Healthcheck | sed 's/^{\[CMD \([^]]*\)\].*/\1/; s/--port 29500/--port '"$port"'/')
in_image "$ctr" -- $check || bad "the health check ($check) failed against a running store"

# Programs find the library through ldconfig, not a path baked in at build time.
in_image "$ctr" -- sh -c 'for p in /usr/local/bin/*; do
    if LC_ALL=C grep -q -a -P "/build(\\x00|:)" "$p"; then echo "$p: RPATH /build"; exit 1; fi
    done' ||
    bad "a program in the image carries a build-tree path (RPATH)"

# Two ranks as two Kubernetes Job pods would run them: clients of that store.
for r in 0 1; do
    in_image --env RANK=$r --env WORLD_SIZE=2 --env MASTER_ADDR=127.0.0.1 \
        --env MASTER_PORT="$port" --env TORCHELASTIC_USE_AGENT_STORE=True \
        "$ctr" -- timeout 300 ddp_tiny 60 >"$cache/rank$r.log" 2>&1 &
    eval "rank${r}_pid=\$!"
done
ok=0
wait "$rank0_pid" || ok=$?
wait "$rank1_pid" || ok=$((ok ? ok : $?))
cat "$cache/rank0.log"
[ "$ok" -eq 0 ] || { cat "$cache/rank1.log"; bad "the 2-rank job against the image's store failed ($ok)"; }
grep -q 'weights identical on all 2 ranks' "$cache/rank0.log" || bad "ddp_tiny did not report identical weights"
stamp "2 ranks against the store: passed"

# c10drun in the image: 2 ranks, rank 0 hosting the store.
in_image "$ctr" -- timeout 300 c10drun -n 2 ddp_tiny 40 >"$cache/c10drun.log" 2>&1 ||
    { cat "$cache/c10drun.log"; bad "c10drun -n 2 ddp_tiny failed in the image"; }
grep -q 'weights identical on all 2 ranks' "$cache/c10drun.log" || bad "c10drun job did not report identical weights"
stamp "c10drun -n 2 in the image: passed"
echo "container test passed"
