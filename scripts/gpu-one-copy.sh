#!/usr/bin/env bash
# One device call that checks and measures two things about a small job's
# host cost on the CUDA engine:
#   1. the operands' upload in one copy where A and B lie back to back in
#      staging and on the device (OperandsContiguous, gpu/cuda/job_layout.h;
#      every float32 n=64 and n=256 job): job_layout_test, job_graph_test,
#      cuda_engine_test (with its accuracy cases, ALL_SHAPES=0 skips them),
#      and job_graph_test's JobGraphTest cases and cuda_engine_test's
#      CudaEngineTest cases (less the real out-of-memory one) under
#      compute-sanitizer memcheck --leak-check full (MEMCHECK=0 skips it);
#   2. matmul-pipeline-bench at n=256 float32, 4 streams, JOBS (default 8)
#      jobs in flight per stream, ROUNDS (default 2) rounds of: operands
#      prestaged and copied into staging (--graphs 0), each with a host
#      function after every job and poll-only up to 4 MiB; main's build
#      (matmul-pipeline-bench-main, two copies per job, when bundled) against
#      this one, and this one with its successors submitted by SUBMIT (default
#      4) bench threads instead of inside Done on the engine's completion
#      thread (--submit-threads); PIPELINE=0 skips it;
#   3. the echo at n=64 c=64 over 8 channels, to tell a normal machine
#      (about 62k req/s on an H100) from a slow one;
#   4. with TARGETS=1, scripts/gpu-targets.sh on SERVERS (default
#      "matmul-server-main matmul-server" when main's server is bundled).
# Expects the programs in .gpubundle (job_layout_test, job_graph_test,
# cuda_engine_test, matmul-pipeline-bench, rawecho, rawclient, and for
# step 4 matmul-server and matmul-bench); writes summary.txt and the logs
# into OUT.
#
#   [ROUNDS=2] [TARGETS=1] scripts/gpu-one-copy.sh OUT
set -u
out=${1:?usage: gpu-one-copy.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
submit=${SUBMIT:-4}

# Whether the bundle (or, without one, PATH) has the program.
bundled() { [ -x ".gpubundle/bin/$1" ] || command -v "$1" >/dev/null; }

log_gpu
if [ "${TESTS:-1}" != 0 ]; then
  log "== 1. tests"
  for t in job_layout_test job_graph_test cuda_engine_test; do
    filter='*'
    [ "$t" = cuda_engine_test ] && [ "${ALL_SHAPES:-1}" = 0 ] && filter='-AllShapes/*'
    timeout 200 "$R" "$t" --gtest_filter="$filter" >"$logs/$t.log" 2>&1
    log "$t rc=$? $(gtest_summary "$logs/$t.log")"
    grep -E "FAILED|Failure" "$logs/$t.log" | head -10 | tee -a "$out/$logfile"
  done
  if [ "${MEMCHECK:-1}" != 0 ]; then
    memcheck "$logs/job_graph_test-memcheck.log" job_graph_test 'JobGraphTest.*'
    # Less the real out-of-memory case, whose cudaMallocFromPoolAsync error
    # is meant: memcheck counts a CUDA API error as one of its errors.
    memcheck "$logs/cuda_engine_test-memcheck.log" cuda_engine_test \
      'CudaEngineTest.*:-CudaEngineTest.RealDeviceOutOfMemoryFailsOnlyThatJob'
  fi
fi

if [ "${PIPELINE:-1}" != 0 ]; then
  log "== 2. matmul-pipeline-bench n=256 float32, 4 streams, ${JOBS:-8} jobs per stream"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for operands in prestaged copied; do
      for poll_only in 0 4194304; do
        for build in main this threads; do
          bin=matmul-pipeline-bench
          args=()
          case $build in
            main) bin=matmul-pipeline-bench-main ;;
            threads) args=(--submit-threads "$submit") ;;
          esac
          bundled "$bin" || continue
          [ "$operands" = copied ] && args+=(--graphs 0)
          f=$logs/pipeline-r$round-$operands-p$poll_only-$build.txt
          timeout 60 "$R" "$bin" --sizes 256 --modes float32 --streams 4 \
            --jobs-per-stream "${JOBS:-8}" --poll-only-max-bytes "$poll_only" \
            --seconds 1.5 "${args[@]}" >"$f" 2>&1
          log "round $round, $operands, poll-only up to $poll_only bytes, $build (rc=$?):"
          grep -E '^ +256 ' "$f" | tee -a "$out/$logfile"
        done
      done
    done
  done
  grep -m1 -E '^ +n ' "$logs/pipeline-r1-prestaged-p0-this.txt" | tee -a "$out/$logfile"
fi

log "== 3. the echo, n=64 c=64 over 8 channels (32 KiB requests)"
ceiling "32768 64 8"

if [ "${TARGETS:-0}" != 0 ]; then
  log "== 4. service targets"
  servers=matmul-server
  bundled matmul-server-main && servers="matmul-server-main matmul-server"
  SERVERS=${SERVERS:-$servers} ROUNDS=${TARGET_ROUNDS:-1} \
    "$(dirname "$0")/gpu-targets.sh" "$out/targets" 2>&1 | tail -40
  cat "$out/targets/targets.txt" >>"$out/$logfile" 2>/dev/null
fi
log "== done $(date -u +%FT%TZ)"
