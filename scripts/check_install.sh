#!/usr/bin/env bash
# Checks the C++ client as a consumer meets it: installed, then found with
# find_package(matmul CONFIG). CI runs it (scripts/test.sh, suite
# "install"), after the main build, whose matmul-server it talks to.
#
#   1. configure   a client-only build (-DMATMUL_BUILD_SERVER=OFF) in a fresh
#                  folder; its cache must show no CUDA compiler and no BLAS
#   2. build       that build, warnings as errors (ccache: mostly hits)
#   3. install     cmake --install into a fresh prefix; the package config,
#                  version file, library and headers must be there
#   4. consumer    examples/ configured with CMAKE_PREFIX_PATH=<prefix> and
#                  built (-Wall -Wextra -Werror), with every installed
#                  client/lib header compiled in a file of its own
#                  (MATMUL_EXAMPLE_CHECK_HEADERS)
#   5. multiply    the example against a real matmul-server (host engine,
#                  127.0.0.1, port 0) on random matrices of random shapes;
#                  each printed product must match numpy.matmul
#
#   MATMUL_SERVER=path/to/matmul-server scripts/check_install.sh
#   (default: $BUILD_DIR/bin/matmul-server, BUILD_DIR defaulting to build)
# Everything it makes is in build-install/ (INSTALL_CHECK_DIR), emptied
# first and kept for a look afterwards: build/, prefix/, example/. It lies
# in the checkout so that ccache (CCACHE_BASEDIR is the checkout) hits for
# the client build and the consumer alike.
# Ends with "check_install: N passed, M failed"; a step after a failed one
# does not run and counts as failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
server_bin=${MATMUL_SERVER:-$root/${BUILD_DIR:-build}/bin/matmul-server}
py=/usr/bin/python3
work=$root/${INSTALL_CHECK_DIR:-build-install}
rm -rf "$work"
mkdir -p "$work"
server_pid=
stop_server() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
}
trap stop_server EXIT

passed=0
failed=0
steps=5
# step NAME COMMAND...: runs COMMAND with its output kept aside; prints it
# only when the step fails, and then stops; on success, only its lines that
# start with "| ".
step() {
  local name=$1
  shift
  if "$@" >"$work/step.log" 2>&1; then
    echo "ok   $name"
    sed -n 's/^| /     /p' "$work/step.log"
    passed=$((passed + 1))
  else
    sed 's/^/     /' "$work/step.log"
    echo "FAIL $name"
    failed=$((steps - passed))
    echo "check_install: $passed passed, $failed failed"
    exit 1
  fi
}

build=$work/build
prefix=$work/prefix
consumer=$work/example

configure() {
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMATMUL_BUILD_SERVER=OFF -DBUILD_TESTING=OFF -DMATMUL_WERROR=ON || return 1
  # What a client-only build must not have looked for.
  if grep -E '^(CMAKE_CUDA_COMPILER|BLAS_[A-Za-z_]*|CBLAS_INCLUDE_DIR|OpenBLAS_DIR):' \
    "$build/CMakeCache.txt"; then
    echo "client-only configure looked for CUDA or BLAS (above)"
    return 1
  fi
}

install_tree() {
  cmake --install "$build" --prefix "$prefix" || return 1
  local f missing=0
  for f in lib/cmake/matmul/matmulConfig.cmake \
    lib/cmake/matmul/matmulConfigVersion.cmake \
    lib/cmake/matmul/matmulTargets.cmake \
    lib/libmatmul_client.a lib/libmatmul_proto.a \
    include/matmul/client/lib/matmul_client.h \
    include/matmul/matmul/v1/matmul.pb.h \
    include/matmul/matmul/v1/matmul.grpc.pb.h; do
    [[ -f $prefix/$f ]] || { echo "not installed: $f"; missing=1; }
  done
  find "$prefix" -type f | sed "s|^$prefix/||" | sort
  echo "| $(find "$prefix" -type f | wc -l) files under the prefix"
  return $missing
}

consumer_build() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$root/examples" -B "$consumer" -G Ninja "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" \
    -DCMAKE_PREFIX_PATH="$prefix" -DMATMUL_EXAMPLE_CHECK_HEADERS=ON || return 1
  # ccache as for the project's own builds (CMakeLists.txt).
  CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1 cmake --build "$consumer" -j "$(nproc)" || return 1
  echo "| $(find "$consumer/headers" -name "*.cc" | wc -l) installed headers compiled one by one"
}

# Starts matmul-server on an ephemeral loopback port; sets server_port.
start_server() {
  [[ -x $server_bin ]] || { echo "no matmul-server at $server_bin (build the main tree first)"; return 1; }
  "$server_bin" --host 127.0.0.1 --port 0 --metrics-port 0 --engine host \
    </dev/null >/dev/null 2>"$work/server.log" &
  server_pid=$!
  local i
  for ((i = 0; i < 600; i++)); do
    server_port=$(sed -n 's/.*serving on port \([0-9][0-9]*\).*/\1/p' "$work/server.log" | head -n 1)
    [[ -n $server_port ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$work/server.log"
  echo "matmul-server did not report 'serving on port N'"
  return 1
}

multiply() {
  start_server || return 1
  # Three products of random shapes, with small integers (exact in float32)
  # and then with fractions (checked to float32 rounding).
  "$py" - "$consumer/multiply" "127.0.0.1:$server_port" <<'EOF'
import subprocess, sys
import numpy as np

example, target = sys.argv[1], sys.argv[2]
rng = np.random.default_rng()
text = lambda m: "; ".join(" ".join(repr(float(v)) for v in row) for row in m)
for case in range(3):
    m, k, n = rng.integers(1, 9, size=3)
    if case < 2:
        a = rng.integers(-9, 10, size=(m, k)).astype(np.float32)
        b = rng.integers(-9, 10, size=(k, n)).astype(np.float32)
    else:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
    r = subprocess.run([example, target, text(a), text(b)],
                       capture_output=True, text=True, timeout=60)
    print("$ multiply %s %r %r" % (target, text(a), text(b)))
    print(r.stdout + r.stderr, end="")
    assert r.returncode == 0, "exit status %d" % r.returncode
    lines = r.stdout.splitlines()
    assert lines[0] == "C = A.B (%dx%d)" % (m, n), lines[0]
    c = np.array([[float(v) for v in l.split()] for l in lines[1:]],
                 dtype=np.float32)
    want = a @ b
    assert c.shape == want.shape, (c.shape, want.shape)
    if case < 2:
        assert np.array_equal(c, want), (c, want)
    else:
        assert np.allclose(c, want, rtol=1e-5, atol=1e-5), (c, want)
    print("| matches numpy.matmul: %dx%d . %dx%d" % (m, k, k, n))
EOF
}

step "configure: client-only (MATMUL_BUILD_SERVER=OFF), no CUDA, no BLAS" configure
step "build: client-only tree" cmake --build "$build" -j "$(nproc)"
step "install: cmake --install into a fresh prefix" install_tree
step "consumer: examples/ with find_package(matmul CONFIG), headers one by one" consumer_build
step "multiply: the example against matmul-server, checked with numpy" multiply
echo "check_install: $passed passed, $failed failed"
