#!/usr/bin/env bash
# One device call on where a c=1 request's engine time goes
# (bench/LOG.md sections 23-25): in the server, the engine's thread
# made a job's device calls in 97-194 µs at n=256 (the `enqueue` stage),
# where raw CUDA makes the same calls in 22-40 µs. This call asks whether
# the engine does so in process too, once the job comes after an idle
# spell from a thread that slept through it:
#   1. GPU tests of the enqueue stage (cuda_engine_test's timed-one-in-N
#      case, job_graph_test's held-instances case), when bundled;
#   2. matmul-idle-job-bench --n 256 --orders serial,nt --gaps-us 0,600
#      --sleep: raw CUDA's enqueue after a sleep;
#   3. matmul-pipeline-bench --sizes 256 --streams 1 --jobs-per-stream 1,
#      operands copied (--graphs 0, then --graphs 8), the successor
#      submitted inside Done, from another thread at once (while the
#      engine's poller polls, as a gRPC thread submits), and 600 µs later
#      from a thread that slept (--submit-gap-us 600): the engine's mean
#      enqueue each way;
#   4. scripts/gpu-targets.sh for SERVERS (default: call by call,
#      --cuda-graphs-per-stream=0, against the default server, graphs on),
#      ROUNDS (default 2) and PAIRS (default 3): the service's stage means,
#      enqueue included, and graphs against call by call;
#   5. the n=256 c=1 point, echo and default server, unpinned and with the
#      server and the client pinned to disjoint CPUs (taskset), then with
#      the lane's thread dispatching (asleep and awake) and with no poller;
#   6. compute-sanitizer memcheck of the two tests in 1, time permitting.
# Expects matmul-idle-job-bench, matmul-pipeline-bench, matmul-server,
# matmul-bench, rawecho and rawclient in .gpubundle; writes summary.txt,
# targets.txt and the outputs into OUT.
#
#   [SERVERS="a b"] [ROUNDS=2] [PAIRS=3] scripts/gpu-c1-enqueue.sh OUT
set -u
out=${1:?usage: gpu-c1-enqueue.sh OUT}
logfile=summary.txt
mkdir -p "$out"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

log_gpu
# The GPU's clocks and load every 250 ms through the call (gpu-clocks.csv);
# after each c=1 point, the SM clocks of its last 3 s go to the summary.
nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,utilization.gpu,power.draw \
  --format=csv,noheader -lms 250 >"$out/gpu-clocks.csv" 2>&1 &
smi=$!
sm_clocks() {
  log "  SM MHz, last 3 s: $(tail -n 12 "$out/gpu-clocks.csv" | awk -F', ' '{printf "%s ", $3}')"
}
if [ "$R" != .gpubundle/run ] || [ -x .gpubundle/bin/cuda_engine_test ]; then
  timeout 120 "$R" cuda_engine_test \
    --gtest_filter='*OneJobInNIsTimedAndEveryJobIsRight*:*Spinning*' >"$out/cuda_engine_test.log" 2>&1
  log "cuda_engine_test rc=$? $(gtest_summary "$out/cuda_engine_test.log")"
fi
if [ "$R" != .gpubundle/run ] || [ -x .gpubundle/bin/job_graph_test ]; then
  timeout 120 "$R" job_graph_test \
    --gtest_filter='*HeldResultsKeepTheirInstancesAndFreedOnesAreReplayed*' >"$out/job_graph_test.log" 2>&1
  log "job_graph_test rc=$? $(gtest_summary "$out/job_graph_test.log")"
fi
log "-- raw CUDA, the host asleep through each gap"
timeout 60 "$R" matmul-idle-job-bench --n 256 --jobs 1000 --gaps-us 0,600 \
  --orders serial,nt --sleep 2>&1 | tee -a "$out/$logfile"
# Successors submitted inside Done; from a thread of the bench's at once
# (while the engine's poller polls); and from one that slept 600 µs.
i=0
for graphs in 0 8; do
  for submit in "--submit-threads 0" "--submit-threads 1" "--submit-gap-us 600"; do
    log "-- in process, one job in flight, --graphs $graphs $submit"
    i=$((i + 1))
    name="pipe-$i-graphs$graphs"
    # shellcheck disable=SC2086 # the option and its value split on purpose
    timeout 90 "$R" matmul-pipeline-bench --sizes 256 --modes float32 \
      --streams 1 --jobs-per-stream 1 --seconds 1.5 --graphs "$graphs" \
      $submit >"$out/$name.txt" 2>&1
    grep -E "^ +256 float32|engine enqueue" "$out/$name.txt" |
      tee -a "$out/$logfile"
    sm_clocks
  done
done
SERVERS=${SERVERS:-"matmul-server:--cuda-graphs-per-stream=0 matmul-server"} \
  ROUNDS=${ROUNDS:-2} PAIRS=${PAIRS:-3} "$(dirname "$0")/gpu-targets.sh" "$out/targets" \
  >"$out/targets.log" 2>&1
log "targets rc=$?"
cp "$out/targets/targets.txt" "$out/targets.txt" 2>/dev/null

# Does where the threads run matter at c=1, or which thread enqueues? The
# echo's and the default server's n=256 c=1 point (3 s): unpinned; with the
# server (or echo) pinned to CPUs 0-7 and the client to 8-15; 0-3 and
# 8-11; then unpinned with the job dispatched by the lane's thread
# (--inline-dispatch-max-bytes=0), with no poller (--completion-poll-us=0)
# and with the lane's thread dispatching awake (--lane-spin-us=2000, where
# the server has it). The stage means (enqueue among them) and the
# SM clocks follow each server point.
if command -v taskset >/dev/null; then
  base_r=$R
  for variant in "- - -" "0-7 8-15 -" "0-3 8-11 -" \
    "- - --inline-dispatch-max-bytes=0" "- - --completion-poll-us=0" \
    "- - --inline-dispatch-max-bytes=0,--lane-spin-us=2000"; do
    read -r server_cpus client_cpus flags <<<"$variant"
    server_r=$base_r client_r=$base_r
    if [ "$server_cpus" != - ]; then
      server_r="taskset -c $server_cpus $base_r"
      client_r="taskset -c $client_cpus $base_r"
    fi
    [ "$flags" = - ] && flags=""
    flags=${flags//,/ }
    log "-- c=1, server on CPUs $server_cpus, client on $client_cpus, flags ${flags:--}"
    $server_r rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
    e=$!
    sleep 1
    # shellcheck disable=SC2086 # the wrapper's words split on purpose
    log "echo 524288 1 1: $(timeout 20 $client_r rawclient 127.0.0.1:50061 524288 1 1 3 2>&1 | tail -1)"
    kill $e
    wait $e 2>/dev/null
    name="c1-${server_cpus}${flags//[^a-z0-9]/_}"
    # shellcheck disable=SC2086 # the flags split on purpose
    R=$server_r start_server "$out/server-$name.log" --metrics-port 9464 $flags
    R=$client_r bench_point "$out/bench-$name.txt" 256 1 1 3
    sm_clocks
    log "$(stage_means "$variant")"
    stop_server
  done
  R=$base_r
else
  log "-- no taskset: the pinned c=1 points did not run"
fi

# compute-sanitizer on the two enqueue tests, while the call has time.
if [ "$SECONDS" -lt 470 ]; then
  memcheck "$out/memcheck-cuda_engine_test.log" cuda_engine_test '*OneJobInNIsTimedAndEveryJobIsRight*'
  memcheck "$out/memcheck-job_graph_test.log" job_graph_test '*HeldResultsKeepTheirInstancesAndFreedOnesAreReplayed*'
else
  log "-- memcheck skipped: ${SECONDS}s gone"
fi
kill $smi
log "== done $(date -u +%FT%TZ), ${SECONDS}s"
