# libc10d image: the store server (c10d-store), the launcher and tools (c10drun,
# c10d-fr, c10d-bench), an example rank program (ddp_tiny), and the library with
# its headers, pkg-config file and CMake package, all under /usr/local.
#
#   CPU (the default base, Debian 12):
#     docker build -t libc10d .
#     podman build --format docker -t libc10d .      # docker format keeps HEALTHCHECK
#   GPU (libc10d loads the CUDA runtime and NCCL at run time: only the runtime
#   stage needs them; the build stage needs no CUDA headers):
#     docker build -t libc10d:cuda \
#       --build-arg BASE_IMAGE=docker.io/nvidia/cuda:13.0.0-runtime-ubuntu24.04 \
#       --build-arg BUILD_IMAGE=docker.io/library/ubuntu:24.04 .
#     (NVIDIA's runtime images carry libcudart and NCCL's libnccl2, the two
#     files libc10d loads; C10D_CUDART_LIBRARY / C10D_NCCL_LIBRARY name others.)
#
# Running it (no ENTRYPOINT: the command is whichever program you name):
#   docker run --rm -p 29500:29500 libc10d               # the store (default CMD)
#   docker run --rm libc10d c10d-store ping --host H     # a client command
#   docker run --rm libc10d c10drun -n 2 ddp_tiny 50     # a 2-rank job in one container
#   docker run --rm -e MASTER_ADDR=H -e MASTER_PORT=29500 -e RANK=0 -e WORLD_SIZE=2 \
#     -e TORCHELASTIC_USE_AGENT_STORE=True libc10d ddp_tiny   # one rank against a store
#
# Image names are fully qualified (registry/namespace/name) so that podman and
# buildah, which refuse short names without a configured search list, build it
# as docker does. Packages come from scripts/install-deps.sh (the script CI and
# the README use), so the recipes cannot drift.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
# The build stage's distribution must be the runtime's or older (glibc).
ARG BUILD_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . /src
# Installed under /stage/usr/local, copied as a whole into the runtime stage:
# /usr/local/lib is on the dynamic loader's default search list (ldconfig),
# so the image leaves the base image's LD_LIBRARY_PATH and PATH as they are.
# No build-tree RPATH: ddp_tiny is copied from the build tree as it is.
RUN cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DC10D_BUILD_TESTS=OFF \
        -DCMAKE_INSTALL_PREFIX=/usr/local -DCMAKE_SKIP_BUILD_RPATH=ON \
    && cmake --build /build -j"$(nproc)" \
        --target c10d c10d_static c10d-store c10drun c10d-fr c10d-bench ddp_tiny \
    && DESTDIR=/stage cmake --install /build \
    && install -m 0755 /build/examples/ddp_tiny /stage/usr/local/bin/ddp_tiny

FROM ${BASE_IMAGE} AS runtime
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh \
    && (getent group c10d || groupadd --gid 10001 c10d) \
    && (getent passwd c10d || useradd --uid 10001 --gid 10001 \
            --home-dir /home/c10d --create-home --shell /usr/sbin/nologin c10d)
COPY --from=build /stage/usr/local/ /usr/local/
RUN ldconfig
# torch's default store port: the store listens on it, env:// ranks dial it.
EXPOSE 29500
# A numeric user, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/c10d
# Healthy while the store answers a PING (Docker image format only: OCI images
# have no health check, and Kubernetes uses its own probes, examples/k8s/).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["c10d-store", "ping", "--host", "127.0.0.1", "--port", "29500", "--timeout-ms", "3000"]
# The store on every address (IPv6 and IPv4); add --token-file F on a shared
# network (docs/security.md). Any other program: name it as the command.
CMD ["c10d-store", "serve", "--host", "::", "--port", "29500"]
