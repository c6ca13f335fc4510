#!/usr/bin/env bash
# One device call that checks and measures small multiplies replayed from
# CUDA graphs (gpu/cuda/job_graph.h, --cuda-graphs-per-stream):
#   1. job_graph_test (every accuracy case recorded, then replayed with other
#      operands; eviction; many jobs in flight; held results; faults;
#      prestaged memory), then its JobGraphTest and JobGraphFaultTest cases
#      under compute-sanitizer memcheck --leak-check full;
#      cuda_engine_test without its accuracy cases (the shared test header);
#   2. matmul-pipeline-bench at n=256 float32, 4 streams, the jobs copying
#      their operands, JOBS (default 8) jobs in flight per stream: --graphs 0
#      (call by call) then --graphs GRAPHS, each with a host function after
#      every job and then poll-only up to POLL_ONLY_BYTES (default 4 MiB);
#      the same with 1 stream (PIPELINE=0 skips it). On a slow H100 graphs
#      gave 2.4x with poll-only where with host functions they had cost 18%
#      (bench/LOG.md section 16);
#   3. scripts/gpu-targets.sh with the server call by call
#      (--cuda-graphs-per-stream=0), with --cuda-graphs-per-stream=GRAPHS, and with that and
#      --poll-only-max-bytes=POLL_ONLY_BYTES (the pair that led in step 2 on
#      the slow H100), ROUNDS (default 1) rounds, against the transport
#      ceiling of the same run (TARGETS=0 skips it).
# (matmul-pipeline-bench's jobs take prestaged operands, which are never
# replayed (JobGraphCache::Replayable); with --graphs N they copy theirs
# into staging instead.)
# Expects the programs in .gpubundle (matmul-server, matmul-bench,
# job_graph_test, cuda_engine_test, matmul-pipeline-bench, rawecho,
# rawclient); writes summary.txt and the logs into OUT.
#
#   scripts/gpu-graphs.sh OUT
set -u
out=${1:?usage: gpu-graphs.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
graphs=${GRAPHS:-8}
poll_only_bytes=${POLL_ONLY_BYTES:-4194304}

log_gpu
log "== 1. tests"
timeout 300 "$R" job_graph_test >"$logs/job_graph_test.log" 2>&1
log "job_graph_test rc=$? $(gtest_summary "$logs/job_graph_test.log")"
grep -E "prestaged:|FAILED|Failure|error" "$logs/job_graph_test.log" | head -20 | tee -a "$out/$logfile"
if [ -x /usr/local/cuda/bin/compute-sanitizer ] && [ -x .gpubundle/bin/job_graph_test ]; then
  LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64 timeout 300 \
    /usr/local/cuda/bin/compute-sanitizer --tool memcheck --leak-check full \
    --error-exitcode 99 .gpubundle/bin/job_graph_test \
    --gtest_filter='JobGraphTest.*:EveryPoint/JobGraphFaultTest.*' >"$logs/job_graph_test-memcheck.log" 2>&1
  log "memcheck rc=$? $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$logs/job_graph_test-memcheck.log" | tr '\n' ' ')"
fi
timeout 300 "$R" cuda_engine_test --gtest_filter='-AllShapes/*' >"$logs/cuda_engine_test.log" 2>&1
log "cuda_engine_test rc=$? $(gtest_summary "$logs/cuda_engine_test.log")"

if [ "${PIPELINE:-1}" != 0 ]; then
  log "== 2. matmul-pipeline-bench n=256 float32, operands copied, graphs off and on, host functions and poll-only"
  for streams in 4 1; do
    for poll_only in 0 "$poll_only_bytes"; do
      for g in 0 "$graphs"; do
        f=$logs/pipeline-s$streams-p$poll_only-g$g.txt
        timeout 60 "$R" matmul-pipeline-bench --sizes 256 --modes float32 \
          --streams "$streams" --graphs "$g" --jobs-per-stream "${JOBS:-8}" \
          --poll-only-max-bytes "$poll_only" --seconds 1.5 >"$f" 2>&1
        log "streams $streams, poll-only up to $poll_only bytes, --graphs $g (rc=$?):"
        grep -E '^ +256 ' "$f" | tee -a "$out/$logfile"
      done
    done
  done
  grep -m1 -E '^ +n ' "$logs/pipeline-s4-p0-g0.txt" | tee -a "$out/$logfile"
fi

if [ "${TARGETS:-1}" != 0 ]; then
  log "== 3. service targets: graphs off, on, and on with poll-only"
  with_graphs=matmul-server:--cuda-graphs-per-stream=$graphs
  SERVERS="matmul-server:--cuda-graphs-per-stream=0 $with_graphs $with_graphs,--poll-only-max-bytes=$poll_only_bytes" \
    ROUNDS=${ROUNDS:-1} "$(dirname "$0")/gpu-targets.sh" "$out/targets" 2>&1 | tail -40
  cat "$out/targets/targets.txt" >>"$out/$logfile" 2>/dev/null
fi
log "== done $(date -u +%FT%TZ)"
