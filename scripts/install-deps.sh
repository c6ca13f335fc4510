#!/usr/bin/env bash
# Installs every system dependency of the project (Debian 12 / Ubuntu 24.04).
# Idempotent: packages already present are skipped, and apt is not touched
# when nothing is missing. README.md, .ci/run and the Dockerfile all use it.
#
#   scripts/install-deps.sh            build + test dependencies (default),
#                                      the Node tools of the checks included
#   scripts/install-deps.sh --build    the same without Node and its tools
#                                      (buf, manifest validation): what
#                                      scripts/demo.sh needs
#   scripts/install-deps.sh --compile  only what compiling matmul-server and
#                                      matmul-cli needs (the image's build
#                                      stages): no test tools, Python,
#                                      Prometheus or Node
#   scripts/install-deps.sh --runtime  only what the server needs to run
set -euo pipefail

mode=${1:---all}

runtime_pkgs=(
  libgrpc++1.51 libprotobuf32 libprometheus-cpp-pull1.0 libopenblas0-pthread
)
compile_pkgs=(
  build-essential cmake ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libopenblas-dev
)
build_pkgs=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libopenblas-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-pytest
  python3-venv python3-pip python3-setuptools python3-wheel
  python3-matplotlib pybind11-dev python3-dev
  prometheus openssl curl ca-certificates
  clang-14 libclang-rt-14-dev clang-format shellcheck
)

case "$mode" in
  --runtime) wanted=("${runtime_pkgs[@]}") ;;
  --compile) wanted=("${compile_pkgs[@]}") ;;
  --all) wanted=("${build_pkgs[@]}")
         # Node may come from elsewhere (e.g. NodeSource, which bundles npm);
         # only ask Debian for it when there is none.
         command -v npm >/dev/null 2>&1 || wanted+=(nodejs npm) ;;
  --build) wanted=("${build_pkgs[@]}") ;;
  *) echo "usage: $0 [--runtime|--compile|--build|--all]" >&2; exit 2 ;;
esac

# Ubuntu 24.04 (noble) renamed the libraries caught by the 64-bit time_t
# transition: gRPC and protobuf carry a t64 suffix there. prometheus-cpp
# (libprometheus-cpp-pull1.0) and OpenBLAS (libopenblas0-pthread) keep their
# Debian names.
if [ -r /etc/os-release ] && . /etc/os-release && [ "${ID:-}" = ubuntu ]; then
  for i in "${!wanted[@]}"; do
    case "${wanted[$i]}" in
      libgrpc++1.51) wanted[i]=libgrpc++1.51t64 ;;
      libprotobuf32) wanted[i]=libprotobuf32t64 ;;
    esac
  done
fi

missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages present"
else
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Node tools used by the checks (buf lint, manifest validation) live in the
# project's own tools/node_modules, pinned by tools/package-lock.json.
if [ "$mode" = --all ] && [ -f "$(dirname "$0")/../tools/package.json" ]; then
  (cd "$(dirname "$0")/../tools" && { { [ -d node_modules ] && npm ls >/dev/null 2>&1; } || npm ci --no-audit --no-fund --loglevel=error; })
fi
