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
# "matmul-server matmul-server:--cuda-graphs-per-stream=0". The ceiling runs
# before and after. The targets (n=256 c=1 p50, n=256 c=64 over 16
# channels and n=64 c=64 over 8 req/s) are also measured paired: PAIRS
# (default 3) times the echo's point of the same request size then the
# server's, 2 s each, with the echo running beside the server, so that each
# ratio or difference comes from the same minute (the echo alone moved 7%
# in req/s and 0.31-0.45 ms in p50 between the before and after runs of one
# call, and 15-30% between calls on one slower machine); PAIRS=0 skips
# them. After each point the server's job counts (stream jobs, graph jobs,
# graphs recorded and evicted, batches) are logged.
# C1_ONLY=1 keeps only the n=256 c=1 points (and the c=1 ceiling): more
# rounds of the one target that small differences decide, in less time.
# BENCH_FLAGS (space-separated) go to every matmul-bench run, and
# C1_BENCH_FLAGS (default --blocking-calls) to its c=1 runs besides: the
# client the echo's rawclient is there (the caller polls for its own
# reply; gRPC's callbacks cost the echo itself 0.09-0.14 ms of p50 on an
# H100, bench/LOG.md section 31). C1_BENCH_FLAGS= gives callbacks.
# Writes OUT/targets.txt and the raw outputs.
#
#   [SERVERS="a b"] [ROUNDS=2] [PAIRS=3] [C1_ONLY=1] [BENCH_FLAGS=...] \
#     [C1_BENCH_FLAGS=...] scripts/gpu-targets.sh OUT
set -u
out=${1:?usage: gpu-targets.sh OUT}
logfile=targets.txt
mkdir -p "$out"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

# Prints the median of the numbers on standard input.
median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "none"; else printf "%.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# One point, the echo and the running server in turn, PAIRS times, 2 s
# each: LABEL FILE N CONCURRENCY CHANNELS. The echo sends 8·N² bytes, the
# size of an n×n float32 request (A and B). Logs each pair's req/s and p50s
# (echo, server), then the median of the server's req/s over the echo's
# (the throughput targets) and of its p50 excess in ms (the c=1 target).
# FILE collects matmul-bench's output.
paired_point() {
  local label=$1 f=$2 n=$3 c=$4 ch=$5 i echo_line server_line
  local echo_rps echo_p50 server_rps server_p50 line=""
  local ratios=() excess=() point_flags=("${bench_flags[@]}")
  [ "$c" = 1 ] && point_flags+=("${c1_bench_flags[@]}")
  $R rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
  local e=$!
  sleep 1
  for i in $(seq 1 "${PAIRS:-3}"); do
    echo_line=$(timeout 20 "$R" rawclient 127.0.0.1:50061 $((8 * n * n)) "$c" "$ch" 2 2>&1 | tail -1)
    echo_rps=$(echo "$echo_line" | sed -n 's/.* rps=\([0-9.]*\) .*/\1/p')
    echo_p50=$(echo "$echo_line" | sed -n 's/.* p50=\([0-9.]*\)ms.*/\1/p')
    timeout 30 "$R" matmul-bench --target $T --shape "$n" --concurrency "$c" \
      --channels "$ch" --duration 2 --warmup 0.5 --timeout 30 "${point_flags[@]}" >"$f.$i" 2>&1
    server_line=$(grep -E "^ +$c +$ch " "$f.$i" | tail -1)
    server_rps=$(echo "$server_line" | awk '{print $4}')
    server_p50=$(echo "$server_line" | awk '{print $9}')
    cat "$f.$i" >>"$f"
    rm -f "$f.$i"
    if [ -z "$echo_rps" ] || [ -z "$echo_p50" ] || [ -z "$server_rps" ] || [ -z "$server_p50" ]; then
      line="$line pair $i: no figure;"
      continue
    fi
    ratios+=("$(awk -v s="$server_rps" -v e="$echo_rps" 'BEGIN { printf "%.3f", s / e }')")
    excess+=("$(awk -v s="$server_p50" -v e="$echo_p50" 'BEGIN { printf "%+.3f", s - e }')")
    line="$line $echo_rps/$server_rps/$echo_p50/$server_p50"
  done
  kill $e
  wait $e 2>/dev/null
  log "$label n=$n c=$c ch=$ch paired (echo req/s / server req/s / echo p50 ms / server p50 ms):$line;" \
    "median server/echo req/s $(printf '%s\n' "${ratios[@]}" | grep . | median)," \
    "median p50 excess $(printf '%s\n' "${excess[@]}" | grep . | median) ms"
}

log_gpu
read -r -a bench_flags <<<"${BENCH_FLAGS:-}"
read -r -a c1_bench_flags <<<"${C1_BENCH_FLAGS---blocking-calls}"
log "matmul-bench flags: ${bench_flags[*]}; at c=1 besides: ${c1_bench_flags[*]}"
ceilings=("32768 64 8" "524288 64 16" "524288 1 1" "8388608 32 16")
[ "${C1_ONLY:-0}" = 1 ] && ceilings=("524288 1 1")
log "== transport ceiling before (REQUEST_BYTES THREADS CHANNELS)"
ceiling "${ceilings[@]}"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for entry in ${SERVERS:-matmul-server}; do
    bin=${entry%%:*}
    flags=""
    [[ $entry == *:* ]] && flags=${entry#*:}
    s=${entry//[^A-Za-z0-9_-]/_}  # a file name
    log "-- $entry, round $round"
    # shellcheck disable=SC2086 # the flags split on purpose
    SERVER_BIN=$bin start_server "$out/server-$s-$round.log" --metrics-port 9464 ${flags//,/ }
    bench_point "$out/bench-$s-$round-n256-c1.txt" 256 1 1 3 "${bench_flags[@]}" "${c1_bench_flags[@]}"
    log "$entry $(stage_means "n=256 c=1")"
    if [ "${PAIRS:-3}" != 0 ]; then
      paired_point "$entry" "$out/paired-$s-$round-n256-c1.txt" 256 1 1
    fi
    if [ "${C1_ONLY:-0}" = 1 ]; then
      stop_server
      continue
    fi
    if [ "${PAIRS:-3}" != 0 ]; then
      paired_point "$entry" "$out/paired-$s-$round-n256-c64.txt" 256 64 16
      paired_point "$entry" "$out/paired-$s-$round-n64-c64.txt" 64 64 8
    fi
    log "$entry $(job_counts "after n=256 c=1 and the paired points")"
    bench_point "$out/bench-$s-$round-n64-c64.txt" 64 64 8 3 "${bench_flags[@]}"
    log "$entry $(job_counts "after n=64 c=64")"
    bench_point "$out/bench-$s-$round-n256-c64.txt" 256 64 16 3 "${bench_flags[@]}"
    log "$entry $(job_counts "after n=256 c=64")"
    bench_point "$out/bench-$s-$round-n1024-c32.txt" 1024 32 16 3 "${bench_flags[@]}"
    log "$entry $(job_counts "after n=1024 c=32")"
    stop_server
  done
done
log "== transport ceiling after"
ceiling "${ceilings[@]}"
log "== done $(date -u +%FT%TZ)"
