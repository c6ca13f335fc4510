# matmul-server images. Two targets, each a build stage and a final stage:
#
#   target          base                                      engine
#   cuda (default)  nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04   CUDA + cuBLAS
#   cpu             debian:${DEBIAN_VERSION}-slim             host (OpenBLAS), no GPU
#
#   docker build -t matmul-server:0.1.0 .
#   docker run --rm --gpus all -p 50051:50051 -p 9464:9464 matmul-server:0.1.0
#   docker build --target cpu -t matmul-server:0.1.0-cpu .
#   docker run --rm -p 50051:50051 -p 9464:9464 matmul-server:0.1.0-cpu
#
# scripts/build-image.sh runs these builds, tags the image
# matmul-server:<version>-<commit> and writes the tag into
# deploy/base/kustomization.yaml (--dry-run prints the commands).
#
# Driver: CUDA 13 needs NVIDIA driver >= 580 on the host. The CUDA images
# declare it (NVIDIA_REQUIRE_CUDA=cuda>=13.0), so on an older driver the
# NVIDIA container runtime refuses to start the container ("unsatisfied
# condition: cuda>=13.0"). For older drivers, build on CUDA 12, which runs on
# drivers >= 525 by CUDA's minor-version compatibility:
#   docker build --build-arg CUDA_VERSION=12.9.1 -t matmul-server:0.1.0-cuda12 .
# The code needs no CUDA 13 API: gpu/ calls only CUDA runtime and cuBLAS
# functions that CUDA 12.0 has, and nothing tests CUDA_VERSION. The build
# needs a CUDA release with ubuntu24.04 images whose nvcc accepts GCC 13:
# 12.5 or later; prefer the newest (12.9.1).
#
# Every flag of matmul-server can also be set as MATMUL_<FLAG> in the
# environment (docker run -e MATMUL_STREAMS_PER_DEVICE=8 ..., or the env of
# a Kubernetes container); arguments after the image name are flags too.
# CI lints this file (scripts/check-deploy.sh).

ARG CUDA_VERSION=13.0.2
ARG DEBIAN_VERSION=12.12

# ---------------------------------------------------------------- cuda build
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
WORKDIR /src
# The same script that sets up a developer machine and CI, in its mode for
# compiling only (no test tools, Python, Prometheus or Node); copied alone
# first so that the dependency layer survives source changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --compile && rm -rf /var/lib/apt/lists/*
COPY . .
# The commit --version reports (the context has no .git): build-image.sh
# passes it.
ARG GIT_COMMIT=unknown
# sm_90: H100/H200 native code (cuBLAS brings its own kernels for others).
# The cache mount keeps ccache's objects across image builds (BuildKit).
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMATMUL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_TESTING=OFF \
      -DMATMUL_GIT_COMMIT=${GIT_COMMIT} \
    && cmake --build build --target matmul-server matmul-cli

# ----------------------------------------------------------------- cpu build
FROM debian:${DEBIAN_VERSION}-slim AS cpu-build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh --compile && rm -rf /var/lib/apt/lists/*
COPY . .
ARG GIT_COMMIT=unknown
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMATMUL_CUDA=OFF -DBUILD_TESTING=OFF -DMATMUL_GIT_COMMIT=${GIT_COMMIT} \
    && cmake --build build --target matmul-server matmul-cli

# ------------------------------------------------------------- target: cpu
# The host engine on OpenBLAS, for machines without an NVIDIA GPU.
FROM debian:${DEBIAN_VERSION}-slim AS cpu
# --build-arg IMAGE_VERSION=$(sed -n 's/^project(matmul VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
ARG IMAGE_VERSION=unknown
LABEL org.opencontainers.image.version=$IMAGE_VERSION
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=cpu-build /src/build/bin/matmul-server /src/build/bin/matmul-cli /usr/local/bin/
RUN ["/usr/local/bin/matmul-server", "--version"]
USER 10001:10001
ENV MATMUL_ENGINE=host \
    MATMUL_HOST=0.0.0.0 \
    MATMUL_PORT=50051 \
    MATMUL_METRICS_PORT=9464 \
    MALLOC_ARENA_MAX=2
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/matmul-server"]

# ------------------------------------------------------------ target: cuda
# The last stage, so the default target.
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04 AS cuda
# --build-arg IMAGE_VERSION=$(sed -n 's/^project(matmul VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
ARG IMAGE_VERSION=unknown
LABEL org.opencontainers.image.version=$IMAGE_VERSION
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=build /src/build/bin/matmul-server /src/build/bin/matmul-cli /usr/local/bin/
# Fails the build here, not at the first start, if a shared library is
# missing (needs no GPU).
RUN ["/usr/local/bin/matmul-server", "--version"]
# No account is needed: a numeric user that owns nothing in the image.
USER 10001:10001
# MALLOC_ARENA_MAX=2: glibc's per-thread arenas let the CUDA server's RSS
# creep by 62-85 MiB over a 60-150 s soak on the H200; with 2 arenas it grew
# 54 MiB at no loss of throughput (docs/RELIABILITY.md).
ENV MATMUL_HOST=0.0.0.0 \
    MATMUL_PORT=50051 \
    MATMUL_METRICS_PORT=9464 \
    MALLOC_ARENA_MAX=2
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/matmul-server"]
