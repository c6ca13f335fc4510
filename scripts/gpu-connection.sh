#!/usr/bin/env bash
# Connection-life settings against throughput and latency on the H200, in one
# device call. Three server configurations, a fresh server each, two rounds:
#   default  keepalive ping after 60 s of quiet, connections closed after
#            5 min (--max-connection-age) with 60 s of grace
#   pings    --keepalive-time 1s --keepalive-timeout 1s (a ping every second)
#   churn    --max-connection-age 1s --max-connection-age-grace 1s (every
#            client connection is closed and replaced every second)
# Each runs matmul-bench at n=1024 c=32 over 16 channels, n=64 c=64 over 8
# channels and n=256 c=1, 4 s each (errors are counted by the bench). The
# transport ceilings for the same points (../shared/bench/transport-ceiling)
# run before and after. Expects matmul-server, matmul-bench, rawecho and
# rawclient in .gpubundle. Writes OUT/connection.txt and the raw outputs.
#
#   scripts/gpu-connection.sh OUT
set -u
out=${1:?usage: gpu-connection.sh OUT}
R=.gpubundle/run
T=127.0.0.1:50051
log() { echo "$*" | tee -a "$out/connection.txt"; }

ceiling() {
  $R rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
  local e=$!
  sleep 1
  for point in "8388608 32 16" "32768 64 8" "524288 1 1"; do
    log "ceiling $point: $(timeout 20 $R rawclient 127.0.0.1:50061 $point 3 2>&1 | tail -1)"
  done
  kill $e
  wait $e 2>/dev/null
}

mode_args() {
  case $1 in
    default) echo "" ;;
    pings) echo "--keepalive-time=1s --keepalive-timeout=1s" ;;
    churn) echo "--max-connection-age=1s --max-connection-age-grace=1s" ;;
  esac
}

ceiling
for round in 1 2; do
  for mode in default pings churn; do
    slog="$out/server-$mode-$round.log"
    # shellcheck disable=SC2046
    $R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 0 \
      --engine cuda --pinned-pool-bytes 4294967296 $(mode_args $mode) 2>"$slog" &
    s=$!
    for _ in $(seq 1 300); do grep -q "serving on port" "$slog" && break; sleep 0.1; done
    log "== round $round, $mode $(mode_args $mode)"
    for point in "1024 32 16" "64 64 8" "256 1 1"; do
      read -r n c ch <<<"$point"
      f="$out/bench-$mode-$round-n$n.txt"
      timeout 60 $R matmul-bench --target $T --shape "$n" --concurrency "$c" \
        --channels "$ch" --duration 4 --warmup 1 --timeout 30 >"$f" 2>&1
      grep -E "^ *[0-9]" "$f" | tee -a "$out/connection.txt" || tail -n 3 "$f" | tee -a "$out/connection.txt"
    done
    kill -TERM $s
    for _ in $(seq 1 100); do kill -0 $s 2>/dev/null || break; sleep 0.1; done
  done
done
ceiling
log "done"
