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
logfile=connection.txt
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

mode_args() {
  case $1 in
    default) echo "" ;;
    pings) echo "--keepalive-time=1s --keepalive-timeout=1s" ;;
    churn) echo "--max-connection-age=1s --max-connection-age-grace=1s" ;;
  esac
}

points=("8388608 32 16" "32768 64 8" "524288 1 1")
ceiling "${points[@]}"
for round in 1 2; do
  for mode in default pings churn; do
    # shellcheck disable=SC2046
    start_server "$out/server-$mode-$round.log" --metrics-port 0 $(mode_args "$mode")
    log "== round $round, $mode $(mode_args "$mode")"
    for point in "1024 32 16" "64 64 8" "256 1 1"; do
      read -r n c ch <<<"$point"
      bench_point "$out/bench-$mode-$round-n$n.txt" "$n" "$c" "$ch" 4
    done
    stop_server
  done
done
ceiling "${points[@]}"
log "done"
