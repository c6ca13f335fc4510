#!/usr/bin/env bash
# One device call that checks a change to gpu/ on the H200:
#   1. the GPU tests: cuda_engine_test and the tests of the CUDA engine's
#      parts, then server_test and
#      multiply_stream_test and multiply_stream_stripe_test on the CUDA engine
#      (MATMUL_TEST_ENGINE=cuda);
#   2. matmul-bench at n=256 c=1, n=64 c=64, n=1024 c=32 and n=4096 c=16
#      against matmul-server-before (the server as it was before the change,
#      when the bundle has it) and matmul-server, one after the other, twice
#      each, in the same run;
#   3. cuda_engine_test under compute-sanitizer (memcheck with --leak-check
#      full, then initcheck), filtered by CHECK_SANITIZE_FILTER, each cut at
#      CHECK_SANITIZE_SECONDS (default 150).
# Expects the programs in .gpubundle (../shared/tools/gpu-bundle); writes
# summary.txt and logs.tgz into OUT.
#
#   scripts/gpu-check.sh OUT
set -u
out=${1:?usage: gpu-check.sh OUT}
logfile=summary.txt
logs=$out/logs  # archived into $out/logs.tgz at the end
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
sanitizer=/usr/local/cuda/bin/compute-sanitizer

log_gpu

gtest_line() {  # NAME LOG: the gtest summary lines of a log
  log "$1: $(grep -E '^\[==========\] [0-9]+ tests? from .* ran|^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \]' "$2" | tr '\n' ' ')"
}

log "== 1. GPU tests"
for t in cuda_engine_test cuda_status_test timing_test stream_pool_test \
  device_memory_test job_layout_test grouped_gemm_test job_graph_test; do
  [ -x ".gpubundle/bin/$t" ] || continue
  timeout 300 "$R" "$t" >"$logs/$t.log" 2>&1
  log "$t rc=$?"
  gtest_line "$t" "$logs/$t.log"
done
for t in server_test multiply_stream_test multiply_stream_stripe_test; do
  MATMUL_TEST_ENGINE=cuda timeout 300 "$R" "$t" >"$logs/$t-cuda.log" 2>&1
  log "$t (cuda) rc=$?"
  gtest_line "$t" "$logs/$t-cuda.log"
done

log "== 2. matmul-bench, before and after"
bench_points() {  # TAG; CHECK_BENCH_POINTS (default all four) picks
  local p
  for p in ${CHECK_BENCH_POINTS:-256:1:1 64:64:8 1024:32:16 4096:16:16}; do
    IFS=: read -r n c ch <<<"$p"
    bench_point "$logs/bench-$1-n$n-c$c.txt" "$n" "$c" "$ch" 3
  done
}
for round in $(seq 1 "${CHECK_BENCH_ROUNDS:-2}"); do
  for server_bin in matmul-server-before matmul-server; do
    [ -x ".gpubundle/bin/$server_bin" ] || continue
    log "-- $server_bin, round $round"
    $R "$server_bin" --host 127.0.0.1 --port 50051 --engine cuda \
      --pinned-pool-bytes 4294967296 2>"$logs/$server_bin-$round.log" &
    server=$!
    for _ in $(seq 1 300); do
      grep -q "serving on port" "$logs/$server_bin-$round.log" && break
      sleep 0.1
    done
    bench_points "$server_bin-$round"
    stop_server
  done
done
log "== 3. compute-sanitizer"
# Less the real out-of-memory case: the cudaMallocFromPoolAsync error it
# provokes on purpose counts as one of the sanitizer's errors (two, with the
# error's read-back; bench/LOG.md section 18).
filter=${CHECK_SANITIZE_FILTER:-*:-CudaEngineTest.RealDeviceOutOfMemoryFailsOnlyThatJob}
for tool in "memcheck --leak-check full" "initcheck"; do
  name=${tool%% *}
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64 \
    timeout "${CHECK_SANITIZE_SECONDS:-150}" $sanitizer --tool $tool --error-exitcode 99 \
    .gpubundle/bin/cuda_engine_test --gtest_filter="$filter" \
    >"$logs/sanitizer-$name.log" 2>&1
  log "compute-sanitizer $name rc=$? $(grep -E 'ERROR SUMMARY' "$logs/sanitizer-$name.log" | tail -1)"
  gtest_line "  tests" "$logs/sanitizer-$name.log"
done

log "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
