#!/usr/bin/env bash
# How a request gets onto a CUDA stream and back, measured on the H200 in one
# device call. Four server configurations, two rounds, a fresh server each:
#   handoff  --inline-dispatch-max-bytes=0 --completion-poll-us=0
#            (the lane thread stages and enqueues, a host function wakes a
#            completion thread: the engine before the poller)
#   inline   --completion-poll-us=0 (the receiving thread enqueues)
#   poll     --inline-dispatch-max-bytes=0 (the poller completes)
#   direct   the defaults: both
# Each runs matmul-bench at n=256 c=1 (latency; then the server's stage
# means from /metrics), n=64 c=64 over 8 channels and n=1024 c=32 over 16
# channels (throughput). The transport ceiling for the n=256 sizes
# (../shared/bench/transport-ceiling rawecho/rawclient: 512 KiB request,
# 256 KiB reply, one call in flight) runs before and after.
# Expects matmul-server, matmul-bench, rawecho and rawclient in .gpubundle.
# Writes OUT/dispatch.txt and the raw bench outputs.
#
#   [MODES="handoff direct"] [ROUNDS=3] scripts/gpu-dispatch.sh OUT
set -u
out=${1:?usage: gpu-dispatch.sh OUT}
logfile=dispatch.txt
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

mode_args() {
  case $1 in
    handoff) echo "--inline-dispatch-max-bytes=0 --completion-poll-us=0" ;;
    inline) echo "--completion-poll-us=0" ;;
    poll) echo "--inline-dispatch-max-bytes=0" ;;
    direct) echo "" ;;
  esac
}

n256="524288 1 1"
ceiling "$n256" "$n256" "$n256"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in ${MODES:-handoff inline poll direct}; do
    # shellcheck disable=SC2046
    start_server "$out/server-$mode-$round.log" --metrics-port 9464 \
      --pinned-pool-bytes 1073741824 $(mode_args "$mode")
    log "== round $round, $mode $(mode_args "$mode")"
    bench_point "$out/bench-$mode-$round-n256.txt" 256 1 1 4
    # The server's stage means over the n=256 requests (and their warm-up).
    stage_means "n=256" | tee -a "$out/dispatch.txt"
    bench_point "$out/bench-$mode-$round-n64.txt" 64 64 8 3
    bench_point "$out/bench-$mode-$round-n1024.txt" 1024 32 16 2
    stop_server
  done
done
ceiling "$n256" "$n256" "$n256"
log "done"
