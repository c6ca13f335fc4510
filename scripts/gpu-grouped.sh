#!/usr/bin/env bash
# One device call that checks and measures mixed small shapes in one launch
# (issue 20 item 2) on the GPU:
#   1. grouped_gemm_test (the CUDA engine's grouped multiply: a 64-512 mix
#      in every dtype, float32 strict and tf32 included, against a float64
#      reference), then again under compute-sanitizer memcheck (MEMCHECK=0
#      skips it);
#   2. matmul-bench --shape-mix MIX (default 64,128,256,512: requests take
#      the shapes in turn) at c=64 over 8 channels, float32 strict and tf32,
#      against three servers in turn:
#        grouped    --grouped-batching: shapes waiting together go out as
#                   one cublasGemmGroupedBatchedEx launch
#        pershape   the default: one strided batch per shape
#        unbatched  --batch-window-us 0: one kernel per request
#        grouped-held  --grouped-batching with --adaptive-batching=false
#                   --batch-window-us HELD_US (default 200): every request
#                   waits up to the window for company, so groups form even
#                   while a stream is free (latency for device time)
#      MODES picks and orders them (default: all four).
#      --server-metrics reads the server's own counters around each point:
#      "device compute X us/request" is matmul_device_compute_busy_seconds
#      (the union of GEMM spans on the device) over its OK multiplies.
#      Each round ends with the ratio unbatched / grouped of that figure
#      (the issue's target: at least 3), pershape / grouped and
#      unbatched / grouped-held.
# GROUPED_SECONDS (default 5) per point after 1 s of warm-up,
# GROUPED_ROUNDS (default 2) rounds. Expects the programs in .gpubundle
# (../shared/tools/gpu-bundle build/bin: matmul-server, matmul-bench,
# grouped_gemm_test); writes summary.txt and logs.tgz into OUT.
# A smoke run without a GPU (step 1 skips): MATMUL_RUN=env
# PATH=build/bin:$PATH MATMUL_SCRIPT_ENGINE=host scripts/gpu-grouped.sh OUT
#
#   scripts/gpu-grouped.sh OUT
set -u
out=${1:?usage: gpu-grouped.sh OUT}
logfile=summary.txt
logs=$out/logs
mkdir -p "$logs"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"
mix=${MIX:-64,128,256,512}
secs=${GROUPED_SECONDS:-5}
modes=${MODES:-grouped pershape unbatched grouped-held}
held_us=${HELD_US:-200}

log_gpu
log "== 1. grouped_gemm_test"
timeout 300 "$R" grouped_gemm_test >"$logs/grouped_gemm_test.log" 2>&1
log "grouped_gemm_test rc=$? $(gtest_summary "$logs/grouped_gemm_test.log")"
if [ "${MEMCHECK:-1}" != 0 ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && [ -x .gpubundle/bin/grouped_gemm_test ]; then
  LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64 timeout 300 \
    /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 99 \
    .gpubundle/bin/grouped_gemm_test >"$logs/grouped_gemm_test-memcheck.log" 2>&1
  log "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$logs/grouped_gemm_test-memcheck.log" | tail -1)"
fi

log "== 2. matmul-bench --shape-mix $mix, c=64, 8 channels, ${secs} s points"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
for round in $(seq 1 "${GROUPED_ROUNDS:-2}"); do
  for compute in strict tf32; do
    declare -A us=()
    for mode in $modes; do
      case $mode in
        grouped) args=(--grouped-batching=true) ;;
        pershape) args=(--grouped-batching=false) ;;
        unbatched) args=(--batch-window-us 0) ;;
        grouped-held) args=(--grouped-batching=true --adaptive-batching=false --batch-window-us "$held_us") ;;
        *) log "unknown mode $mode"; continue ;;
      esac
      start_server "$logs/server-$mode-$compute-$round.log" --metrics-port 9464 "${args[@]}"
      f=$logs/bench-$mode-$compute-$round.txt
      timeout 120 "$R" matmul-bench --target "$T" --shape-mix "$mix" --compute "$compute" \
        --concurrency 64 --channels 8 --duration "$secs" --warmup 1 --timeout 30 \
        --verify --verify-every 256 --server-metrics 127.0.0.1:9464 \
        --json "$logs/bench-$mode-$compute-$round.json" >"$f" 2>&1
      log "$mode $compute r$round: $(grep -E '^ *[0-9]' "$f" | head -1)"
      line=$(grep "server:" "$f" || tail -n 2 "$f")
      log "    $line"
      us[$mode]=$(sed -n 's/.*device compute \([0-9.]*\) us\/request.*/\1/p' <<<"$line")
      stop_server
    done
    log "  $compute r$round: device compute us/request grouped ${us[grouped]:-?}, pershape ${us[pershape]:-?}, unbatched ${us[unbatched]:-?}, grouped-held ${us[grouped-held]:-?}; unbatched/grouped $(ratio "${us[unbatched]:-0}" "${us[grouped]:-0}"), pershape/grouped $(ratio "${us[pershape]:-0}" "${us[grouped]:-0}"), unbatched/grouped-held $(ratio "${us[unbatched]:-0}" "${us[grouped-held]:-0}")"
  done
done
log "== done $(date -u +%FT%TZ)"
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
