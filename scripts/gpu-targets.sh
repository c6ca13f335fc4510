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
# before and after. The c=1 target is also measured paired: PAIRS (default 3)
# times the echo's n=256-sized point then the server's, 2 s each, with the
# echo running beside the server, so that each difference of p50s comes
# from the same minute (the echo's p50 alone moved 0.31-0.45 ms between the
# before and after runs of one call); PAIRS=0 skips it.
# Writes OUT/targets.txt and the raw outputs.
#
#   [SERVERS="a b"] [ROUNDS=2] [PAIRS=3] scripts/gpu-targets.sh OUT
set -u
out=${1:?usage: gpu-targets.sh OUT}
logfile=targets.txt
mkdir -p "$out"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

# n=256 c=1, the echo and the running server in turn, PAIRS times: each
# pair's p50s (ms) and the server's excess, then the median excess, on one
# line after the label given. FILE collects matmul-bench's output.
paired_c1() {
  local label=$1 f=$2 i echo_p50 server_p50 line=""
  $R rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
  local e=$!
  sleep 1
  local excess=()
  for i in $(seq 1 "${PAIRS:-3}"); do
    echo_p50=$(timeout 20 $R rawclient 127.0.0.1:50061 524288 1 1 2 2>&1 |
      tail -1 | sed -n 's/.* p50=\([0-9.]*\)ms.*/\1/p')
    timeout 30 $R matmul-bench --target $T --shape 256 --concurrency 1 \
      --channels 1 --duration 2 --warmup 0.5 --timeout 30 >"$f.$i" 2>&1
    server_p50=$(grep -E '^ +1 +1 ' "$f.$i" | tail -1 | awk '{print $9}')
    cat "$f.$i" >>"$f"
    rm -f "$f.$i"
    if [ -z "$echo_p50" ] || [ -z "$server_p50" ]; then
      line="$line pair $i: no figure;"
      continue
    fi
    excess+=("$(awk -v s="$server_p50" -v e="$echo_p50" 'BEGIN { printf "%+.3f", s - e }')")
    line="$line $echo_p50/$server_p50/${excess[-1]}"
  done
  kill $e
  wait $e 2>/dev/null
  local median=none
  if [ ${#excess[@]} -gt 0 ]; then
    median=$(printf '%s\n' "${excess[@]}" | sort -g | awk '{ v[NR] = $1 } END { printf "%+.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  fi
  log "$label n=256 c=1 paired p50 ms (echo/server/excess):$line median excess $median"
}

log_gpu
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
    [ "${PAIRS:-3}" != 0 ] && paired_c1 "$entry" "$out/paired-$s-$round.txt"
    bench_point "$out/bench-$s-$round-n64-c64.txt" 64 64 8 3
    bench_point "$out/bench-$s-$round-n256-c64.txt" 256 64 16 3
    bench_point "$out/bench-$s-$round-n1024-c32.txt" 1024 32 16 3
    stop_server
  done
done
log "== transport ceiling after"
ceiling "32768 64 8" "524288 64 16" "524288 1 1" "8388608 32 16"
log "== done $(date -u +%FT%TZ)"
