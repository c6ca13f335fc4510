# matmul-server on NVIDIA GPUs. Two stages on pinned CUDA 13.0 images:
# "build" compiles with the devel image, the final stage holds the runtime
# image (CUDA runtime, cuBLAS), the runtime libraries that
# scripts/install-deps.sh --runtime installs, and the two binaries.
#
#   docker build -t matmul:0.1.0 .
#   docker run --rm --gpus all -p 50051:50051 -p 9464:9464 matmul:0.1.0
#
# Every flag of matmul-server can also be set as MATMUL_<FLAG> in the
# environment (docker run -e MATMUL_STREAMS_PER_DEVICE=8 ..., or the env of
# a Kubernetes container); arguments after the image name are flags too.
# CI lints this file (scripts/check-deploy.sh).

ARG CUDA_VERSION=13.0.2

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
WORKDIR /src
# The same script that sets up a developer machine and CI; copied alone
# first so that the dependency layer survives source changes.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# sm_90: H100/H200 native code (cuBLAS brings its own kernels for others).
# The cache mount keeps ccache's objects across image builds (BuildKit).
RUN --mount=type=cache,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DMATMUL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_TESTING=OFF \
    && cmake --build build --target matmul-server matmul-cli

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
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
