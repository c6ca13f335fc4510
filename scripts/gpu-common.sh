# shellcheck shell=bash
# Shared by the scripts that measure the server on the H200 (gpu-*.sh):
# sourced, not run. Expects `out` (the output folder) and `logfile` (the
# summary file's name in it) to be set, and the programs in .gpubundle.
# A smoke run without a GPU: MATMUL_RUN=env PATH=build/bin:$PATH
# MATMUL_SCRIPT_ENGINE=host scripts/gpu-....sh OUT
R=${MATMUL_RUN:-.gpubundle/run}
T=127.0.0.1:50051

# A device call returns at most 8 files from OUT (the device tool's README,
# Limits). So when the outermost gpu-*.sh script exits, every file under
# `out` but the summaries at its top (summary.txt, targets.txt and its
# own `logfile`) goes into OUT/outputs.tgz (`tar tzf` lists them); a
# gpu-*.sh it runs leaves that to it.
# shellcheck disable=SC2154 # out and logfile: set by the sourcing script
pack_outputs() {
  local files
  files=$(cd "$out" && find . -type f ! -path ./summary.txt \
    ! -path ./targets.txt ! -path "./$logfile" ! -path ./outputs.tgz | sort)
  [ -n "$files" ] || return 0
  (cd "$out" && printf '%s\n' "$files" | tar czf outputs.tgz -T - &&
    printf '%s\n' "$files" | xargs rm -f &&
    find . -mindepth 1 -type d -empty -delete)
}
if [ -z "${MATMUL_OUTPUTS_PACKED_BY:-}" ]; then
  export MATMUL_OUTPUTS_PACKED_BY=$$
  trap pack_outputs EXIT
fi

# Prints and appends to the summary.
log() { echo "$*" | tee -a "$out/$logfile"; }

# The run's first summary line: the time, the GPU and its driver.
log_gpu() {
  log "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
}

# A gtest log's totals on one line: passed (and failed) counts, and how
# many tests skipped (not each skipped test's line).
gtest_summary() {
  echo "$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$1" | tr '\n' ' ')" \
    "skipped: $(grep -cE '^\[  SKIPPED \] .*\(' "$1")"
}

# The transport ceiling (../shared/bench/transport-ceiling): rawecho, then
# one rawclient run of 3 s per argument, each "REQUEST_BYTES THREADS
# CHANNELS".
ceiling() {
  $R rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
  local e=$!
  sleep 1
  local point
  for point in "$@"; do
    # shellcheck disable=SC2086
    log "ceiling $point: $(timeout 20 $R rawclient 127.0.0.1:50061 $point 3 2>&1 | tail -1)"
  done
  kill $e
  wait $e 2>/dev/null
}

# Starts matmul-server (or the bundled program named by $SERVER_BIN, e.g. a
# build from before a change) on the CUDA engine at $T with the given extra
# arguments, logging to the file named first; sets `server` to its pid.
start_server() {
  local slog=$1
  shift
  $R "${SERVER_BIN:-matmul-server}" --host 127.0.0.1 --port 50051 --engine "${MATMUL_SCRIPT_ENGINE:-cuda}" \
    --pinned-pool-bytes 4294967296 "$@" 2>"$slog" &
  server=$!
  for _ in $(seq 1 300); do grep -q "serving on port" "$slog" && break; sleep 0.1; done
}

stop_server() {
  kill -TERM "$server"
  for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
}

# One matmul-bench point: FILE N CONCURRENCY CHANNELS SECONDS [ARGS...];
# its table line goes to the summary.
bench_point() {
  local f=$1 n=$2 c=$3 ch=$4 secs=$5
  shift 5
  # shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
  timeout 60 $R matmul-bench --target $T --shape "$n" --concurrency "$c" \
    --channels "$ch" --duration "$secs" --warmup 1 --timeout 30 "$@" >"$f" 2>&1
  grep -E "^ *[0-9]" "$f" | tee -a "$out/$logfile" || tail -n 3 "$f" | tee -a "$out/$logfile"
}

# The server's job counts so far from /metrics on 127.0.0.1:9464, on one
# line after the label given: jobs on its streams, of them replayed from
# CUDA graphs, graphs recorded and evicted, and the batching engine's
# launches and the requests they carried (cumulative: a point's own are the
# difference from the line before it).
job_counts() {
  python3 - "$1" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9464/metrics").read().decode()
names = [("stream jobs", "matmul_stream_jobs_total"),
         ("graph jobs", "matmul_device_graph_jobs_total"),
         ("graphs recorded", "matmul_device_graphs_recorded_total"),
         ("graphs evicted", "matmul_device_graphs_evicted_total"),
         ("batch launches", "matmul_batch_size_count"),
         ("batched requests", "matmul_batch_size_sum")]
totals = {}
for label, name in names:
    for line in text.splitlines():
        m = re.match(re.escape(name) + r'(\{[^}]*\})? (\S+)$', line)
        if m:
            totals[label] = totals.get(label, 0.0) + float(m[2])
print(sys.argv[1] + " job counts: " + ", ".join(
    f"{label} {totals[label]:.0f}" for label, _ in names if label in totals))
PY
}

# The server's stage means and its mean Multiply time, in ms, from
# /metrics on 127.0.0.1:9464, on one line after the label given.
stage_means() {
  python3 - "$1" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9464/metrics").read().decode()
sums, counts = {}, {}
for line in text.splitlines():
    m = re.match(r'matmul_stage_duration_seconds_(sum|count)\{.*stage="(\w+)".*\} (\S+)', line)
    if m:
        (sums if m[1] == "sum" else counts)[m[2]] = float(m[3])
req = [0.0, 0.0]
for line in text.splitlines():
    m = re.match(r'matmul_request_duration_seconds_(sum|count)\{.*method="Multiply".*\} (\S+)', line)
    if m:
        req[m[1] == "count"] += float(m[2])
sums["request"], counts["request"] = req
print(sys.argv[1] + " server means (ms): " + ", ".join(
    f"{k} {1e3 * sums[k] / counts[k]:.3f}" for k in sums if counts.get(k)))
PY
}

# compute-sanitizer memcheck (--leak-check full) on a bundled test, cut at
# 200 s, and its error and leak summaries logged: LOG TEST FILTER. Nothing
# where the sanitizer or the test is missing.
memcheck() {
  [ -x /usr/local/cuda/bin/compute-sanitizer ] && [ -x ".gpubundle/bin/$2" ] || return 0
  LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64 timeout 200 \
    /usr/local/cuda/bin/compute-sanitizer --tool memcheck --leak-check full \
    --error-exitcode 99 ".gpubundle/bin/$2" --gtest_filter="$3" >"$1" 2>&1
  log "memcheck $2 $3 rc=$? $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$1" | tr '\n' ' ')"
}
