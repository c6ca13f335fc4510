#!/usr/bin/env bash
# One device call that measures the batching engine's modes on the H200, in
# the same run as the transport ceiling (../shared/bench/transport-ceiling's
# rawecho/rawclient, same message sizes, concurrency and channels):
#   off       --batch-window-us 0 (no batching; the default before 0.2)
#   fixed     --batch-window-us 100 --adaptive-batching=false (every group
#             waits 100 us for company)
#   adaptive  the default: at once while a stream is free, batches while all
#             are busy (window 1000 us as the bound)
# at n=64 c=64 (8 channels), n=256 c=64 (16), n=256 c=1, n=1024 c=32 (16),
# 3 s points, BATCHING_ROUNDS rounds (default 2), each round every mode in
# turn. Then the server's matmul_batch_size histogram after an adaptive
# round. Expects the programs in .gpubundle (rawecho and rawclient too);
# writes summary.txt and logs.tgz into OUT.
#
#   scripts/gpu-batching.sh OUT
set -u
out=${1:?usage: gpu-batching.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

log_gpu
log "== transport ceiling (REQUEST_BYTES THREADS CHANNELS)"
ceiling "32768 64 8" "524288 64 16" "524288 1 1" "8388608 32 16"

points="64:64:8 256:64:16 256:1:1 1024:32:16"
for round in $(seq 1 "${BATCHING_ROUNDS:-2}"); do
  for mode in off fixed adaptive; do
    case $mode in
      off) args=(--batch-window-us 0) ;;
      fixed) args=(--batch-window-us 100 --adaptive-batching=false) ;;
      adaptive) args=() ;;
    esac
    log "-- $mode, round $round"
    start_server "$logs/server-$mode-$round.log" "${args[@]}"
    for p in $points; do
      IFS=: read -r n c ch <<<"$p"
      bench_point "$logs/bench-$mode-$round-n$n-c$c.txt" "$n" "$c" "$ch" 3
    done
    if [ "$mode" = adaptive ]; then
      curl -s http://127.0.0.1:9464/metrics >"$logs/metrics-$round.txt" 2>/dev/null ||
        wget -qO "$logs/metrics-$round.txt" http://127.0.0.1:9464/metrics
      log "$(grep -E '^matmul_batch_size' "$logs/metrics-$round.txt" | tr '\n' ' ')"
    fi
    stop_server
  done
done
log "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
