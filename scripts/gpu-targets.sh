#!/usr/bin/env bash
# Issue 20's service targets in one device call, each server against the
# transport ceiling of the same run (../shared/bench/transport-ceiling's
# rawecho/rawclient: same message sizes, concurrency and channels):
#   n=64 c=64 over 8 channels, n=256 c=64 over 16 (req/s against echo),
#   n=256 c=1 (p50 against echo's; then the server's stage means from
#   /metrics, for where the time goes), n=1024 c=32 over 16 (no regression).
# SERVERS names the bundled server programs to compare (default
# "matmul-server"; e.g. "matmul-server-before matmul-server" with a build of
# the commit before the change copied into the bundle under that name), each
# with default flags, in turn, ROUNDS rounds (default 2), 3 s points. A name
# may carry flags after a colon, commas for spaces, e.g.
# "matmul-server matmul-server:--cuda-graphs-per-stream=8". The ceiling runs
# before and after.
# Writes OUT/targets.txt and the raw outputs.
#
#   [SERVERS="a b"] [ROUNDS=2] scripts/gpu-targets.sh OUT
set -u
out=${1:?usage: gpu-targets.sh OUT}
logfile=targets.txt
mkdir -p "$out"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

log "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
log "== transport ceiling before (REQUEST_BYTES THREADS CHANNELS)"
ceiling "32768 64 8" "524288 64 16" "524288 1 1" "8388608 32 16"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for entry in ${SERVERS:-matmul-server}; do
    bin=${entry%%:*}
    flags=""
    [[ $entry == *:* ]] && flags=${entry#*:}
    s=${entry//[^A-Za-z0-9_-]/_}  # a file name
    log "-- $entry, round $round"
    # shellcheck disable=SC2086 # the flags split on purpose
    SERVER_BIN=$bin start_server "$out/server-$s-$round.log" --metrics-port 9464 ${flags//,/ }
    bench_point "$out/bench-$s-$round-n256-c1.txt" 256 1 1 3
    log "$entry $(stage_means "n=256 c=1")"
    bench_point "$out/bench-$s-$round-n64-c64.txt" 64 64 8 3
    bench_point "$out/bench-$s-$round-n256-c64.txt" 256 64 16 3
    bench_point "$out/bench-$s-$round-n1024-c32.txt" 1024 32 16 3
    stop_server
  done
done
log "== transport ceiling after"
ceiling "32768 64 8" "524288 64 16" "524288 1 1" "8388608 32 16"
log "== done $(date -u +%FT%TZ)"
