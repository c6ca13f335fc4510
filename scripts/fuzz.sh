#!/usr/bin/env bash
# Builds the libFuzzer target tests/fuzz/request_fuzzer with clang-14
# (libFuzzer + ASan + UBSan, host engine only) and runs it for a bounded time
# on the seed corpus tests/fuzz/corpus. Fails on any crash, sanitizer report,
# leak, timeout or out-of-memory. Inputs the run discovers go to a temporary
# directory, never into the repository; a crashing input is kept in
# $build/fuzz-artifacts/ (replay: $build/bin/request_fuzzer FILE).
#
#   scripts/fuzz.sh [SECONDS]     default 60
#   FUZZ_BUILD_DIR=... scripts/fuzz.sh   (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=$(nproc)

if ! command -v clang++-14 >/dev/null; then
  echo "fuzz.sh: clang++-14 not found (Debian: clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi

echo "fuzz: configure and build $build (clang-14, libFuzzer, ASan+UBSan)"
start=$(date +%s)
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMATMUL_CUDA=OFF -DMATMUL_FUZZ=ON \
  -DMATMUL_SANITIZE="address;undefined" >/dev/null
cmake --build "$build" -j "$jobs" --target request_fuzzer
echo "fuzz: build took $(($(date +%s) - start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$build/fuzz-artifacts"

# halt_on_error/abort_on_error: any report ends the run with a crash artifact.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1:symbolize=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1

echo "fuzz: request_fuzzer for ${seconds} s"
# New inputs land in the first corpus directory (the temporary one); the
# checked-in seeds are only read.
"$build/bin/request_fuzzer" \
  -max_total_time="$seconds" \
  -max_len=4096 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$build/fuzz-artifacts/" \
  "$work/corpus" tests/fuzz/corpus
echo "fuzz: no crash in ${seconds} s; $(find "$work/corpus" -mindepth 1 -maxdepth 1 | wc -l) new corpus entries (discarded)"
