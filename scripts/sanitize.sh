#!/usr/bin/env bash
# Builds and runs the test suite under sanitizers (host engine, no CUDA):
#
#   asan  build-asan: ASan + UBSan (MATMUL_SANITIZE="address;undefined"), the
#         whole CTest suite: gtest binaries, and the Python / end-to-end tests
#         against the instrumented matmul-server, matmul-cli and matmul-bench
#         (the interpreter is not instrumented and needs no preload: each
#         binary carries its own runtime). LeakSanitizer runs at every exit
#         of an instrumented binary; the servers the Python tests start must
#         exit 0, so a leak fails them too. The soak runs for
#         SANITIZE_SOAK_SECONDS (default 20).
#   tsan  build-tsan: TSan (MATMUL_SANITIZE=thread): the gtest binaries that
#         do not carry gRPC traffic (host engine, pinned pool, metrics,
#         validation, wire codec, bench library, ...), run directly with
#         tests/sanitizers/absl_tsan_annotations preloaded (Debian's absl is
#         not instrumented) and OPENBLAS_NUM_THREADS=1 (OpenBLAS's own thread
#         pool hands results over in uninstrumented code). Not run under TSan:
#         TSAN_EXCLUDED below (in-process gRPC servers and channels: Debian's
#         gRPC is not instrumented, and its call hand-offs between threads
#         produce hundreds of reports inside gRPC's inline headers and call
#         arenas), and the Python / end-to-end tests (the preload would reach
#         the uninstrumented interpreter). tests/sanitizers/README.md has the
#         evidence.
# Any report fails the run: halt_on_error / abort_on_error everywhere.
#
#   scripts/sanitize.sh [asan|tsan|all]     default all
#   ASAN_BUILD_DIR=... TSAN_BUILD_DIR=... scripts/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=$(nproc)
which=${1:-all}

step() { printf '\n== sanitize: %s\n' "$*"; }
now() { date +%s; }

configure() {  # build-dir sanitizers
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBUILD_TESTING=ON -DMATMUL_CUDA=OFF -DMATMUL_SANITIZE="$2" >/dev/null
}

run_asan() {
  local build=${ASAN_BUILD_DIR:-build-asan}
  step "ASan+UBSan: build $build"
  local t0; t0=$(now)
  configure "$build" "address;undefined"
  cmake --build "$build" -j "$jobs"
  echo "ASan+UBSan build: $(($(now) - t0)) s"

  step "ASan+UBSan: ctest"
  t0=$(now)
  # The quarantine is capped so that the soak's RSS check (baseline taken
  # after a warm-up) measures the server, not 256 MiB of freed blocks.
  ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:quarantine_size_mb=64 \
  UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0 \
  MATMUL_SOAK_SECONDS=${SANITIZE_SOAK_SECONDS:-20} \
  MATMUL_SOAK_RSS_SLACK_MIB=128 \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900 \
      --no-tests=error --output-junit "$root/$build/test-results/ctest.xml"
  echo "ASan+UBSan tests: $(($(now) - t0)) s"
}

# gtest binaries that run gRPC servers or channels in-process.
TSAN_EXCLUDED=(server_test multiply_stream_test multiply_stream_stripe_test
               matmul_client_test metrics_endpoint_test
               stored_tensor_client_test metrics_device_health_test
               device_health_server_test shared_memory_test
               shared_memory_client_test cuda_memory_test
               cuda_memory_client_test)

run_tsan() {
  local build=${TSAN_BUILD_DIR:-build-tsan}
  step "TSan: build $build"
  local t0; t0=$(now)
  configure "$build" thread
  cmake --build "$build" -j "$jobs"
  echo "TSan build: $(($(now) - t0)) s"

  step "TSan: gtest binaries"
  t0=$(now)
  local preload="$root/$build/tests/sanitizers/libabsl_tsan_annotations.so"
  [[ -f $preload ]] || { echo "missing $preload" >&2; exit 1; }
  local failed=() count=0
  mkdir -p "$build/test-results"
  rm -f "$build"/test-results/tsan-*.xml
  for test in "$build"/bin/*_test; do
    if [[ " ${TSAN_EXCLUDED[*]} " == *" ${test##*/} "* ]]; then
      echo "-- ${test##*/}: not under TSan (in-process gRPC, see above)"
      continue
    fi
    count=$((count + 1))
    local t1; t1=$(now)
    printf -- '-- %s ... ' "${test##*/}"
    if LD_PRELOAD=$preload OPENBLAS_NUM_THREADS=1 \
       TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp" \
       "$test" --gtest_brief=1 --gtest_output="xml:$build/test-results/tsan-${test##*/}.xml" \
         >"$build/${test##*/}.tsan.log" 2>&1; then
      echo "ok ($(($(now) - t1)) s)"
    else
      echo "FAILED ($(($(now) - t1)) s), log: $build/${test##*/}.tsan.log"
      tail -60 "$build/${test##*/}.tsan.log"
      failed+=("${test##*/}")
    fi
  done
  echo "TSan tests: $count binaries, $(($(now) - t0)) s"
  ((count > 0)) || { echo "TSan: no test binary in $build/bin" >&2; exit 1; }
  if ((${#failed[@]})); then
    echo "TSan failed: ${failed[*]}" >&2
    exit 1
  fi
}

case $which in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_asan; run_tsan ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
printf '\nsanitizers: no reports\n'
