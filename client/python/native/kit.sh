#!/usr/bin/env bash
# Builds matmul_client._native on a machine that has a compiler, Python
# headers and pybind11 but not this build's C++ dependencies (the H200
# image: Python 3.12, pip's pybind11, no gRPC headers), from a kit packed on
# the build machine.
#
#   client/python/native/kit.sh pack     here, after building matmul_client_native:
#       .nativekit/ gets the headers of gRPC, protobuf and Abseil, the
#       generated protobuf headers, and libmatmul_client.a and
#       libmatmul_proto.a (position-independent, debug info stripped); the
#       shared libraries come from .gpubundle/lib (gpu-bundle of
#       matmul-server, matmul-bench and build/python/matmul_client/_native*.so).
#   client/python/native/kit.sh build    there, from the repository root,
#       carrying .nativekit, .gpubundle and build/python: compiles the
#       core's sources (client/python/native/*.cc) for that machine's
#       python3 into $PKG/matmul_client/_native$(EXT_SUFFIX) (PKG: default
#       build/python).
#       Run Python with LD_LIBRARY_PATH=$PWD/.gpubundle/lib.
set -euo pipefail
cd "$(dirname "$0")/../../.."
kit=.nativekit
case "${1:-}" in
  pack)
    rm -rf "$kit"; mkdir -p "$kit/include" "$kit/lib"
    for d in grpc grpcpp grpc++ google/protobuf absl; do
      mkdir -p "$kit/include/$(dirname "$d")"; cp -r "/usr/include/$d" "$kit/include/$d"
    done
    cp -r build/proto/gen/. "$kit/include/"
    cp build/client/lib/libmatmul_client.a build/proto/libmatmul_proto.a "$kit/lib/"
    strip --strip-debug "$kit"/lib/*.a
    echo "kit.sh: $(du -sh "$kit" | cut -f1) in $kit"
    ;;
  build)
    py=${PYTHON:-python3}
    suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
    out=${PKG:-build/python}/matmul_client/_native$suffix
    # shellcheck disable=SC2046
    ${CXX:-g++} -O2 -DNDEBUG -fPIC -fvisibility=hidden -pthread -std=c++17 -shared \
      -I. -I"$kit/include" $("$py" -m pybind11 --includes) \
      client/python/native/*.cc \
      "$kit/lib/libmatmul_client.a" "$kit/lib/libmatmul_proto.a" \
      -Wl,--as-needed $(ls .gpubundle/lib/*.so*) \
      -o "$out"
    echo "kit.sh: built $out"
    ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
