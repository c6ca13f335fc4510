#!/usr/bin/env bash
# One device call that checks and measures small jobs completed by the
# poller alone (CudaEngineOptions::poll_only_max_bytes, the server's
# --poll-only-max-bytes): no CUDA host function after their stream work.
#   1. cuda_engine_test's completion modes (the poll-only ones included),
#      then the poll-only modes under compute-sanitizer memcheck;
#   2. matmul-pipeline-bench at n=256 (float32, tf32, bfloat16; 4 streams)
#      with JOBS (default "2 8") jobs in flight per stream, host functions
#      for every job and then poll-only up to POLL_ONLY_BYTES (default
#      64 MiB); each also --batched (the server's path: operands copied,
#      adaptive batching);
#   3. scripts/gpu-targets.sh with the server as it is and with
#      --poll-only-max-bytes=POLL_ONLY_BYTES, ROUNDS (default 1) rounds,
#      against the transport ceiling of the same run (TARGETS=0 skips it;
#      SERVERS as gpu-targets.sh takes it replaces the pair).
# Expects the programs in .gpubundle (matmul-server, matmul-bench,
# matmul-pipeline-bench, cuda_engine_test, rawecho, rawclient); writes
# summary.txt and the logs into OUT.
#
#   scripts/gpu-poll-only.sh OUT
set -u
out=${1:?usage: gpu-poll-only.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
bytes=${POLL_ONLY_BYTES:-67108864}

log_gpu
log "== 1. tests"
timeout 300 "$R" cuda_engine_test --gtest_filter='EveryMode/*' >"$logs/completion.log" 2>&1
log "completion modes rc=$? $(gtest_summary "$logs/completion.log")"
grep -E "FAILED|Failure" "$logs/completion.log" | head -20 | tee -a "$out/$logfile"
if [ -x /usr/local/cuda/bin/compute-sanitizer ] && [ -x .gpubundle/bin/cuda_engine_test ]; then
  LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64 timeout 300 \
    /usr/local/cuda/bin/compute-sanitizer --tool memcheck --leak-check full \
    --error-exitcode 99 .gpubundle/bin/cuda_engine_test \
    --gtest_filter='EveryMode/*PollOnly*' >"$logs/completion-memcheck.log" 2>&1
  log "memcheck rc=$? $(gtest_summary "$logs/completion-memcheck.log") $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$logs/completion-memcheck.log" | tr '\n' ' ')"
fi

log "== 2. matmul-pipeline-bench n=256, 4 streams"
for jobs in ${JOBS:-2 8}; do
  for poll_only in 0 "$bytes"; do
    f=$logs/pipeline-j$jobs-p$poll_only
    timeout 120 "$R" matmul-pipeline-bench --sizes 256 --jobs-per-stream "$jobs" \
      --poll-only-max-bytes "$poll_only" --batched --seconds 1.5 --json "$f.json" >"$f.txt" 2>&1
    log "jobs/stream $jobs, poll-only up to $poll_only bytes (rc=$?):"
    grep -E '^ +256 ' "$f.txt" | tee -a "$out/$logfile"
  done
done
grep -m1 -E '^ +n ' "$logs"/pipeline-j*-p0.txt | head -1 | tee -a "$out/$logfile"

if [ "${TARGETS:-1}" != 0 ]; then
  log "== 3. service targets, host functions and poll-only"
  SERVERS=${SERVERS:-"matmul-server matmul-server:--poll-only-max-bytes=$bytes"} \
    ROUNDS=${ROUNDS:-1} "$(dirname "$0")/gpu-targets.sh" "$out/targets" 2>&1 | tail -40
  cat "$out/targets/targets.txt" >>"$out/$logfile" 2>/dev/null
fi
log "== done $(date -u +%FT%TZ)"
