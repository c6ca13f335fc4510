#!/usr/bin/env bash
# One device call that looks for what keeps the engine's four streams below
# the raw pipeline (bench/LOG.md section 18: at n=256 float32 the
# engine's pool made 68% of MeasurePipelined's jobs/s): matmul-pipeline-bench
# --pipe-with each part of the engine's per-job stream work alone (its four
# timed events; only start and end, or only end, timed or not;
# stream-ordered memory; two copies; a host function), then the engine's
# poll-only set (four events, memory, two copies) and all of them, ROUNDS
# (default 2) rounds, with the pool (prestaged, poll-only up to
# 4 MiB, JOBS (default 8) per stream) measured in each run beside it. If
# one part takes the raw pipeline (pipe/s) down to the pool's rate, the
# device pays for that part; `enq us` gives what each costs the host to
# enqueue, on one thread (the engine's lanes, poller and completion threads
# all call into the same driver). If neither explains the pool's 22 us a
# job, the cost is in the engine's own host work.
# Expects matmul-pipeline-bench in .gpubundle; writes summary.txt and the
# outputs into OUT.
#
# Then the pool alone with one job in N timed, N in TIMED_EVERY (default
# "1 2 4 16"; CudaEngineOptions::timed_job_every).
#
#   [ROUNDS=2] [SIZES=256] [WITH='events memory ...'] [TIMED_EVERY='1 16']
#     scripts/gpu-pipe-extras.sh OUT
set -u
out=${1:?usage: gpu-pipe-extras.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

log_gpu
for round in $(seq 1 "${ROUNDS:-2}"); do
  # shellcheck disable=SC2086 # WITH is a list
  for with in "" ${WITH:-events start-end-events end-event end-event,untimed \
    events,untimed memory two-copies host-function events,memory,two-copies \
    events,memory,two-copies,host-function}; do
    f=$logs/pipe-r$round-${with:-plain}.txt
    args=()
    [ -n "$with" ] && args=(--pipe-with "$with")
    timeout 60 "$R" matmul-pipeline-bench --sizes "${SIZES:-256}" --modes float32 \
      --streams 4 --jobs-per-stream "${JOBS:-8}" --poll-only-max-bytes 4194304 \
      --seconds 1.5 "${args[@]}" >"$f" 2>&1
    log "round $round, raw pipeline with ${with:-nothing more} (rc=$?):"
    grep -E '^ +[0-9]+ ' "$f" | tee -a "$out/$logfile"
  done
done
# The engine's pool with one job in N timed (--timed-job-every; section 19:
# the four timestamps a job are what hold the pool), the same rounds.
for round in $(seq 1 "${ROUNDS:-2}"); do
  for every in ${TIMED_EVERY:-1 2 4 16}; do
    f=$logs/timed-r$round-every$every.txt
    timeout 60 "$R" matmul-pipeline-bench --sizes "${SIZES:-256}" --modes float32 \
      --streams 4 --jobs-per-stream "${JOBS:-8}" --poll-only-max-bytes 4194304 \
      --seconds 1.5 --timed-job-every "$every" >"$f" 2>&1
    log "round $round, the pool with one job in $every timed (rc=$?):"
    grep -E '^ +[0-9]+ ' "$f" | tee -a "$out/$logfile"
  done
done
grep -m1 -E '^ +n ' "$logs/pipe-r1-plain.txt" | tee -a "$out/$logfile"
log "== done $(date -u +%FT%TZ)"
