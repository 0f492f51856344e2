# libc10d image: the c10d-store server, the tools (c10drun, c10d-bench) and the
# library with headers. Built against CUDA + NCCL (only a version probe uses them
# so far: the nccl backend is not written yet).
#   docker build -t libc10d .
#   docker run --rm -p 29500:29500 libc10d                   # store server
#   docker run --rm --entrypoint c10drun libc10d -n 2 ...    # a tool
# Dependencies come from scripts/install-deps.sh, the same script the README
# and CI use, so the recipes cannot drift.
ARG CUDA_VERSION=13.0.0
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DC10D_BUILD_TESTS=OFF \
        -DC10D_WITH_NCCL=ON -DCMAKE_INSTALL_PREFIX=/opt/c10d \
    && cmake --build /build -j"$(nproc)" \
    && cmake --install /build

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=build /opt/c10d /opt/c10d
ENV PATH=/opt/c10d/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/c10d/lib \
    PKG_CONFIG_PATH=/opt/c10d/lib/pkgconfig
# The store is the service this image runs by default (torch's default port).
EXPOSE 29500
USER 65534:65534
ENTRYPOINT ["c10d-store"]
CMD ["serve", "--host", "::", "--port", "29500"]
