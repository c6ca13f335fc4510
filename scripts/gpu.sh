#!/usr/bin/env bash
# The GPU runner: one device call runs the named suites, in the order given,
# against the programs in .gpubundle (../shared/tools/gpu-bundle build/bin
# build/ceiling/bin), and leaves in OUT:
#   summary.txt  every suite's lines, written as they happen
#   results.tsv  one row per measured point: suite, server, round, point,
#                req/s, payload GB/s, p50 ms, errors
#   outputs.tgz  everything else (logs, bench tables, JSON): the device
#                tool returns at most 8 files, so the rest is packed
#
#   scripts/gpu.sh OUT SUITE...       e.g. scripts/gpu.sh OUT tests bench
#   scripts/gpu.sh --help
#
# Suites:
#   tests       the GPU tests (GPU_TESTS), then the server and client tests
#               that take MATMUL_TEST_ENGINE=cuda (ENGINE_TESTS), filtered by
#               TESTS_FILTER (default '*'); SOAK_SECONDS=N adds the soak on
#               the CUDA engine (needs build/python carried)
#   sanitizers  compute-sanitizer (SANITIZE_TOOLS, default "memcheck
#               initcheck"; memcheck with --leak-check full) on
#               SANITIZE_TESTS (default cuda_engine_test, whose cases include
#               the gathered ones, and cuda_shared_memory_test), filtered by
#               SANITIZE_FILTER (default all but the real out-of-memory case,
#               whose CUDA error is meant), each cut at SANITIZE_SECONDS (150)
#   bench       the standard table: matmul-bench at n=256 c=1, n=256 c=64,
#               n=64 c=64, n=1024 c=32 and n=4096 c=16 over TCP; shared
#               memory over the server's Unix socket at n=64 c=64 and n=256
#               c=64; one 16384² float32 multiply over MultiplyStream with
#               the stripes and chunks the client picks; the transport
#               ceiling (rawecho/rawclient) of the same sizes before and
#               after. BENCH_POINTS replaces the points
#   compare     before/after of two server builds: the bundle holds
#               matmul-server-before (a build of the commit before the
#               change) and matmul-server; ROUNDS (default 2) rounds, the
#               builds interleaved in each; each point's figure per build per
#               round, then the median ratio. COMPARE_POINTS (default the
#               bench suite's TCP points) replaces the points
#   stored      stored operands (--resident) at n=4096, 8 in flight: float32
#               strict and tf32, bfloat16. STORED_POINTS replaces the points
#   pipeline    the engine in process against its raw ceilings
#               (matmul-pipeline-bench PIPELINE_ARGS, default n=4096
#               float32, tf32 and bfloat16) and the host-to-device copy
#               from registered, pinned and pageable memory (shm_copy_bench
#               SHM_COPY_ARGS, default 1 GiB)
#
# A point is KIND:N:C:CH[:DTYPE[:COMPUTE]], N a size or a comma-separated
# shape mix (--shape-mix), C requests in flight, CH connections:
#   tcp       unary Multiply over TCP
#   shm       operands and products in shared memory, over the Unix socket
#   resident  operands and products kept on the server (--resident)
#   stream    MultiplyStream; stream:N:C[:STRIPES[:CHUNK_MIB]] (0 or absent:
#             what the client library picks)
#
# Environment, for the bench, compare and stored suites:
#   SERVERS      the bundled server programs, each with its own flags after a
#                colon, commas for spaces: "matmul-server
#                matmul-server:--batch-window-us=0,--completion-poll-us=0"
#                (default matmul-server; compare: matmul-server-before
#                matmul-server); SERVER_FLAGS (space-separated) go to every
#                server, e.g. a flag whose value holds commas
#   ROUNDS       rounds, each server in turn in each (default 1; compare 2)
#   DURATION     seconds per point (3), WARMUP before each (1)
#   BENCH_FLAGS  more matmul-bench flags for every point, C1_BENCH_FLAGS for
#                the points at c=1 besides (e.g. --blocking-calls, as the
#                echo's client makes blocking calls)
#   PAIRS        N > 0: each TCP point also runs N times paired with the echo
#                of its size (PAIR_SECONDS, default 2, each), the echo running
#                beside the server: the ratio and p50 difference of the same
#                minute
#   STREAM_REQUESTS  multiplies measured at a stream point (3)
#   CEILING=0    no transport ceiling; CEILING_SECONDS per echo point (3)
# and PORT (50051), METRICS_PORT (9464), ECHO_PORT (50061), SOCKET
# (/tmp/matmul-gpu.sock).
#
# A smoke run without a GPU, on the host engine, with short points:
#   MATMUL_RUN=env PATH=build/bin:build/ceiling/bin:$PATH \
#     MATMUL_SCRIPT_ENGINE=host DURATION=0.5 WARMUP=0.2 \
#     BENCH_POINTS="tcp:64:4:2 shm:64:4:2 stream:512:1" scripts/gpu.sh OUT bench
set -u

usage() { sed -n '2,/^set -u$/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  "" | -*) echo "usage: scripts/gpu.sh OUT SUITE... (--help lists the suites)" >&2; exit 2 ;;
esac
out=$1
shift
[ $# -gt 0 ] || { echo "gpu.sh: name at least one suite (--help lists them)" >&2; exit 2; }
for suite in "$@"; do
  case $suite in
    tests | sanitizers | bench | compare | stored | pipeline) ;;
    *) echo "gpu.sh: no suite '$suite' (--help lists them)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
logs=$out/logs
summary=$out/summary.txt
tsv=$out/results.tsv
[ -f "$tsv" ] || printf 'suite\tserver\tround\tpoint\treq_s\tgb_s\tp50_ms\terrors\n' >"$tsv"

R=${MATMUL_RUN:-.gpubundle/run}
engine=${MATMUL_SCRIPT_ENGINE:-cuda}
port=${PORT:-50051}
metrics_port=${METRICS_PORT:-9464}
echo_port=${ECHO_PORT:-50061}
socket=${SOCKET:-/tmp/matmul-gpu.sock}
T=127.0.0.1:$port
sanitizer=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}

# When the run ends, every file under OUT but the summary and the table
# goes into OUT/outputs.tgz (`tar tzf` lists them).
pack_outputs() {
  local files
  files=$(cd "$out" && find . -type f ! -path ./summary.txt \
    ! -path ./results.tsv ! -path ./outputs.tgz | sort)
  [ -n "$files" ] || return 0
  (cd "$out" && printf '%s\n' "$files" | tar czf outputs.tgz -T - &&
    printf '%s\n' "$files" | xargs rm -f &&
    find . -mindepth 1 -type d -empty -delete)
}
server=""
echo_pid=""
finish() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null
  [ -n "$echo_pid" ] && kill "$echo_pid" 2>/dev/null
  pack_outputs
}
trap finish EXIT

# Prints and appends to the summary.
log() { echo "$*" | tee -a "$summary"; }

# Whether the bundle (or, in a smoke run, PATH) has the program.
have() { [ -x ".gpubundle/bin/$1" ] || { [ "$R" != .gpubundle/run ] && command -v "$1" >/dev/null; }; }
# The program's file, for tools that run it themselves (compute-sanitizer).
binpath() { if [ -x ".gpubundle/bin/$1" ]; then echo ".gpubundle/bin/$1"; else command -v "$1"; fi; }

# A gtest log's totals on one line: passed (and failed) counts, and how many
# tests skipped (not each skipped test's line).
gtest_summary() {
  echo "$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$1" | tr '\n' ' ')" \
    "skipped: $(grep -cE '^\[  SKIPPED \] .*\(' "$1")"
}

# Runs one gtest binary: LOGNAME TEST [ENV=VALUE...]; logs its totals and
# its failed tests.
run_test() {
  local name=$1 t=$2
  shift 2
  if ! have "$t"; then
    log "$name: not bundled"
    return
  fi
  env "$@" timeout "${TEST_SECONDS:-300}" "$R" "$t" --gtest_filter="${TESTS_FILTER:-*}" \
    >"$logs/$name.log" 2>&1
  log "$name rc=$? $(gtest_summary "$logs/$name.log")"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/$name.log" | sort -u | head -20 | tee -a "$summary"
}

# ------------------------------------------------------------------ tests
suite_tests() {
  log "== tests"
  local t
  for t in ${GPU_TESTS:-cuda_engine_test cuda_status_test timing_test \
    stream_pool_test device_memory_test job_layout_test \
    job_graph_test cuda_shared_memory_test device_health_server_test}; do
    run_test "$t" "$t"
  done
  for t in ${ENGINE_TESTS:-server_test multiply_stream_test \
    multiply_stream_stripe_test matmul_client_test stored_tensor_client_test \
    shared_memory_client_test}; do
    run_test "$t-$engine" "$t" MATMUL_TEST_ENGINE="$engine"
  done
  if [ "${SOAK_SECONDS:-0}" != 0 ]; then
    # The first python3 with pytest (on PATH, or Debian's).
    local py="" candidate bindir
    for candidate in python3 /usr/bin/python3; do
      "$candidate" -c 'import pytest' 2>/dev/null && py=$candidate && break
    done
    if [ -z "$py" ]; then
      log "soak: no python3 with pytest"
    elif [ -d build/python ] && have matmul-server; then
      bindir=$(dirname "$(binpath matmul-server)")
      LD_LIBRARY_PATH="$PWD/.gpubundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
        MATMUL_BIN_DIR=$(cd "$bindir" && pwd) PYTHONPATH="$PWD/build/python" \
        MATMUL_SOAK_ENGINE=$engine MATMUL_SOAK_SECONDS=$SOAK_SECONDS \
        MATMUL_SOAK_REPORT="$logs/soak-$engine.json" \
        timeout $((SOAK_SECONDS + 120)) "$py" -m pytest -q -p no:cacheprovider tests/soak \
        >"$logs/soak.log" 2>&1
      log "soak ($engine, ${SOAK_SECONDS} s) rc=$? $(tail -n 1 "$logs/soak.log")"
    else
      log "soak: needs build/python carried and matmul-server bundled"
    fi
  fi
}

# ------------------------------------------------------------- sanitizers
suite_sanitizers() {
  log "== sanitizers"
  if [ ! -x "$sanitizer" ]; then
    log "no compute-sanitizer at $sanitizer: skipped"
    return
  fi
  local t tool name f
  for t in ${SANITIZE_TESTS:-cuda_engine_test cuda_shared_memory_test}; do
    if ! have "$t"; then
      log "$t: not bundled"
      continue
    fi
    for tool in ${SANITIZE_TOOLS:-memcheck initcheck}; do
      local args=(--tool "$tool")
      [ "$tool" = memcheck ] && args+=(--leak-check full)
      f=$logs/sanitizer-$t-$tool.log
      LD_LIBRARY_PATH=.gpubundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} \
        timeout "${SANITIZE_SECONDS:-150}" "$sanitizer" "${args[@]}" --error-exitcode 99 \
        "$(binpath "$t")" \
        --gtest_filter="${SANITIZE_FILTER:-*:-CudaEngineTest.RealDeviceOutOfMemoryFailsOnlyThatJob}" \
        >"$f" 2>&1
      local rc=$?
      name="$t $tool rc=$rc"
      [ $rc = 124 ] && name="$name (cut at ${SANITIZE_SECONDS:-150} s)"
      log "$name $(grep -E 'ERROR SUMMARY|LEAK SUMMARY' "$f" | tail -2 | tr '\n' ' ')"
      log "  $(gtest_summary "$f")"
    done
  done
}

# --------------------------------------------------------------- pipeline
suite_pipeline() {
  log "== pipeline"
  local f
  local pipeline_args=${PIPELINE_ARGS:---sizes 4096 --modes float32,tf32,bfloat16 --seconds 1}
  local shm_copy_args=${SHM_COPY_ARGS:---bytes 1073741824}
  if have matmul-pipeline-bench; then
    f=$logs/pipeline
    # shellcheck disable=SC2086 # the arguments split on purpose
    timeout 300 "$R" matmul-pipeline-bench $pipeline_args --json "$f.json" >"$f.txt" 2>&1
    log "matmul-pipeline-bench $pipeline_args rc=$?"
    tail -n 12 "$f.txt" | tee -a "$summary"
  else
    log "matmul-pipeline-bench: not bundled"
  fi
  if have shm_copy_bench; then
    f=$logs/shm_copy_bench.txt
    # shellcheck disable=SC2086 # the arguments split on purpose
    timeout 120 "$R" shm_copy_bench $shm_copy_args >"$f" 2>&1
    log "shm_copy_bench $shm_copy_args rc=$?"
    tail -n 8 "$f" | tee -a "$summary"
  else
    log "shm_copy_bench: not bundled"
  fi
}

# ------------------------------------------- the tables (bench, compare, stored)

# The echo's request bytes for a point of n and dtype (A and B).
request_bytes() {
  local size=4
  case $2 in float64) size=8 ;; float16 | bfloat16) size=2 ;; esac
  echo $((2 * $1 * $1 * size))
}

# Splits a point into its fields (globals p_*): kind n c ch dtype compute,
# and for a stream stripes and chunk_mib.
parse_point() {
  IFS=: read -r p_kind p_n p_c p_ch p_dtype p_compute <<<"$1"
  p_c=${p_c:-1}
  p_stripes=0 p_chunk_mib=0
  if [ "$p_kind" = stream ]; then
    p_stripes=${p_ch:-0} p_chunk_mib=${p_dtype:-0} p_ch="" p_dtype=""
  fi
  p_dtype=${p_dtype:-float32}
  p_compute=${p_compute:-strict}
}

# The transport ceiling of a suite's points, before or after its servers:
# SUITE WHEN POINT... rawecho on ECHO_PORT, one rawclient run a point.
ceiling() {
  local suite=$1 when=$2 point line echo_points=()
  shift 2
  [ "${CEILING:-1}" = 0 ] && return
  for point in "$@"; do
    parse_point "$point"
    case $p_kind in
      tcp) [[ $p_n == *,* ]] || echo_points+=("$(request_bytes "$p_n" "$p_dtype") $p_c ${p_ch:-$((p_c < 16 ? p_c : 16))}") ;;
      stream) echo_points+=("8388608 1 1" "8388608 8 8") ;;
    esac
  done
  [ ${#echo_points[@]} -gt 0 ] || return
  if ! have rawecho || ! have rawclient; then
    log "no rawecho/rawclient bundled (../shared/bench/transport-ceiling): no ceiling"
    return
  fi
  log "-- transport ceiling $when (REQUEST_BYTES THREADS CHANNELS)"
  "$R" rawecho "127.0.0.1:$echo_port" >/dev/null 2>&1 &
  echo_pid=$!
  sleep 1
  for point in $(printf '%s\n' "${echo_points[@]}" | tr ' ' : | awk '!seen[$0]++'); do
    # shellcheck disable=SC2086 # BYTES THREADS CHANNELS split on purpose
    line=$(timeout 60 "$R" rawclient "127.0.0.1:$echo_port" ${point//:/ } \
      "${CEILING_SECONDS:-3}" 2>&1 | tail -1)
    log "echo ${point//:/ }: $line"
    echo_row "$suite" "$when" "echo:${point}" "$line"
  done
  kill "$echo_pid"
  wait "$echo_pid" 2>/dev/null
  echo_pid=""
}

# A results.tsv row from a rawclient line: SUITE ROUND POINT LINE.
echo_row() {
  local rps p50 gbs
  rps=$(sed -n 's/.*rps=\([0-9.]*\).*/\1/p' <<<"$4")
  p50=$(sed -n 's/.*p50=\([0-9.]*\)ms.*/\1/p' <<<"$4")
  gbs=$(sed -n 's/.*wireGB\/s=\([0-9.]*\).*/\1/p' <<<"$4")
  printf '%s\techo\t%s\t%s\t%s\t%s\t%s\t0\n' "$1" "$2" "$3" "${rps:--}" "${gbs:--}" "${p50:--}" >>"$tsv"
}

# Starts a server entry (PROGRAM[:FLAG,FLAG...]) on the engine with the
# metrics port and the Unix socket, logging to the file given; sets
# `server` to its pid. Fails when it does not serve within 60 s.
start_server() {
  local slog=$1 entry=$2 bin flags=() common=()
  bin=${entry%%:*}
  [[ $entry == *:* ]] && IFS=, read -r -a flags <<<"${entry#*:}"
  read -r -a common <<<"${SERVER_FLAGS:-}"
  if ! have "$bin"; then
    log "$bin: not bundled"
    return 1
  fi
  rm -f "$socket"
  "$R" "$bin" --host 127.0.0.1 --port "$port" --metrics-port "$metrics_port" \
    --unix-socket "$socket" --engine "$engine" ${common[@]+"${common[@]}"} \
    ${flags[@]+"${flags[@]}"} 2>"$slog" &
  server=$!
  local _
  for _ in $(seq 1 600); do
    grep -q "serving on port" "$slog" && return 0
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  log "$entry did not start: $(tail -n 2 "$slog" | tr '\n' ' ')"
  stop_server
  return 1
}

stop_server() {
  [ -n "$server" ] || return 0
  kill -TERM "$server" 2>/dev/null
  local _
  for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=""
}

# The server's /metrics into a file (empty when it cannot be read).
scrape() {
  python3 - "http://127.0.0.1:$metrics_port/metrics" >"$1" 2>/dev/null <<'PY' || : >"$1"
import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
PY
}

# The server's mean stage times over a point, from two /metrics scrapes:
# BEFORE AFTER; one line, in ms (matmul_stage_duration_seconds, and the
# Multiply request as a whole).
stage_means() {
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import re, sys
def read(path):
    sums, counts = {}, {}
    for line in open(path):
        m = re.match(r'matmul_stage_duration_seconds_(sum|count)\{.*stage="(\w+)".*\} (\S+)', line)
        if m:
            d = sums if m[1] == "sum" else counts
            d[m[2]] = d.get(m[2], 0.0) + float(m[3])
        m = re.match(r'matmul_request_duration_seconds_(sum|count)\{.*method="Multiply".*\} (\S+)', line)
        if m:
            d = sums if m[1] == "sum" else counts
            d["request"] = d.get("request", 0.0) + float(m[2])
    return sums, counts
(s0, c0), (s1, c1) = read(sys.argv[1]), read(sys.argv[2])
parts = []
for k in s1:
    n = c1.get(k, 0.0) - c0.get(k, 0.0)
    if n > 0:
        parts.append(f"{k} {1e3 * (s1[k] - s0.get(k, 0.0)) / n:.3f}")
if parts:
    print("server means (ms): " + ", ".join(parts))
PY
}

# The matmul-bench arguments of a point (parse_point's fields), into `args`.
point_args() {
  args=(--concurrency "$p_c" --dtype "$p_dtype" --compute "$p_compute")
  if [[ $p_n == *,* ]]; then args+=(--shape-mix "$p_n"); else args+=(--shape "$p_n"); fi
  case $p_kind in
    tcp) args+=(--target "$T") ;;
    shm) args+=(--target "unix:$socket" --shared-memory) ;;
    resident) args+=(--target "$T" --resident) ;;
    stream)
      args+=(--target "$T" --stream --distinct 1)
      [ "$p_stripes" != 0 ] && args+=(--stripes "$p_stripes")
      [ "$p_chunk_mib" != 0 ] && args+=(--stream-chunk-bytes $((p_chunk_mib * 1048576)))
      ;;
  esac
  [ "$p_kind" != stream ] && [ -n "$p_ch" ] && args+=(--channels "$p_ch")
  if [ "$p_kind" = stream ]; then
    args+=(--requests "${STREAM_REQUESTS:-3}" --warmup 0)
  else
    args+=(--duration "${DURATION:-3}" --warmup "${WARMUP:-1}")
  fi
  args+=(--timeout 120 --server-metrics "127.0.0.1:$metrics_port" "${bench_flags[@]}")
  [ "$p_c" = 1 ] && [ "$p_kind" != stream ] && args+=("${c1_bench_flags[@]}")
}

# One point against the running server: SUITE ENTRY ROUND POINT. Logs its
# table line, the server's line (device time, jobs and launches per
# request) and, over TCP, the server's stage means; adds its row.
run_point() {
  local suite=$1 entry=$2 round=$3 point=$4 f line means name
  parse_point "$point"
  point_args
  name=${entry//[^A-Za-z0-9_-]/_}-r$round-${point//[^A-Za-z0-9]/_}
  f=$logs/bench-$suite-$name.txt
  scrape "$logs/metrics-before.txt"
  timeout 300 "$R" matmul-bench "${args[@]}" >"$f" 2>&1
  local rc=$?
  scrape "$logs/metrics-after.txt"
  line=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$f" | tail -1)
  if [ -z "$line" ]; then
    log "$point $entry r$round: no figure (rc=$rc) $(tail -n 2 "$f" | tr '\n' ' ')"
    printf '%s\t%s\t%s\t%s\t-\t-\t-\t-\n' "$suite" "$entry" "$round" "$point" >>"$tsv"
    return
  fi
  log "$point $entry r$round: $line"
  grep -E '^ +c=[0-9]+ server:' "$f" | sed 's/^ */    /' | tee -a "$summary"
  if [ "$p_kind" = tcp ]; then
    means=$(stage_means "$logs/metrics-before.txt" "$logs/metrics-after.txt")
    [ -n "$means" ] && log "    $means"
  fi
  awk -v s="$suite" -v e="$entry" -v r="$round" -v p="$point" \
    '{ printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s, e, r, p, $4, $7, $9, $13 }' \
    <<<"$line" >>"$tsv"
  [ "$p_kind" = tcp ] && [ "${PAIRS:-0}" != 0 ] && paired_point "$suite" "$entry" "$round" "$point"
}

# A TCP point paired with the echo: PAIRS times the echo's run of the same
# request size, in flight and connections, then the server's, PAIR_SECONDS
# each, the echo running beside the server. Logs each pair and the medians
# of the server's req/s over the echo's and of its p50 excess.
paired_point() {
  local suite=$1 entry=$2 round=$3 point=$4 i f echo_line server_line
  local ratios=() excess=() line=""
  parse_point "$point"
  [[ $p_n == *,* ]] && return
  if ! have rawecho || ! have rawclient; then return; fi
  # The paired runs are shorter: their own duration and warm-up.
  local DURATION=${PAIR_SECONDS:-2} WARMUP=0.5
  point_args
  "$R" rawecho "127.0.0.1:$echo_port" >/dev/null 2>&1 &
  echo_pid=$!
  sleep 1
  f=$logs/paired-$suite-${entry//[^A-Za-z0-9_-]/_}-r$round-${point//[^A-Za-z0-9]/_}.txt
  for i in $(seq 1 "$PAIRS"); do
    echo_line=$(timeout 60 "$R" rawclient "127.0.0.1:$echo_port" \
      "$(request_bytes "$p_n" "$p_dtype")" "$p_c" "${p_ch:-$((p_c < 16 ? p_c : 16))}" \
      "${PAIR_SECONDS:-2}" 2>&1 | tail -1)
    timeout 120 "$R" matmul-bench "${args[@]}" >"$f.$i" 2>&1
    server_line=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$f.$i" | tail -1)
    cat "$f.$i" >>"$f"
    rm -f "$f.$i"
    local er ep sr sp
    er=$(sed -n 's/.*rps=\([0-9.]*\).*/\1/p' <<<"$echo_line")
    ep=$(sed -n 's/.*p50=\([0-9.]*\)ms.*/\1/p' <<<"$echo_line")
    sr=$(awk '{print $4}' <<<"$server_line")
    sp=$(awk '{print $9}' <<<"$server_line")
    if [ -z "$er" ] || [ -z "$ep" ] || [ -z "$sr" ] || [ -z "$sp" ]; then
      line="$line pair $i: no figure;"
      continue
    fi
    ratios+=("$(awk -v s="$sr" -v e="$er" 'BEGIN { printf "%.3f", s / e }')")
    excess+=("$(awk -v s="$sp" -v e="$ep" 'BEGIN { printf "%+.3f", s - e }')")
    line="$line $er/$sr/$ep/$sp"
  done
  kill "$echo_pid"
  wait "$echo_pid" 2>/dev/null
  echo_pid=""
  log "    paired (echo req/s / server req/s / echo p50 ms / server p50 ms):$line;" \
    "median server/echo req/s $(printf '%s\n' "${ratios[@]}" | median)," \
    "median p50 excess $(printf '%s\n' "${excess[@]}" | median) ms"
}

# The median of the numbers on standard input ("none" without any).
median() {
  grep . | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "none"; else printf "%.3f\n", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Each point's figures per server per round, from results.tsv: SUITE. The
# last server's median req/s over the first's, and its p50 difference.
figures() {
  python3 - "$tsv" "$1" <<'PY' | tee -a "$summary"
import csv, statistics, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")
        if r["suite"] == sys.argv[2] and r["server"] != "echo"]
points, servers = [], []
for r in rows:
    if r["point"] not in points: points.append(r["point"])
    if r["server"] not in servers: servers.append(r["server"])
def num(x):
    try: return float(x)
    except ValueError: return None
print(f"-- {sys.argv[2]}: req/s (p50 ms) per server per round")
for p in points:
    parts, med = [], {}
    for s in servers:
        mine = [r for r in rows if r["point"] == p and r["server"] == s]
        parts.append(s + " " + ", ".join(f"r{r['round']} {r['req_s']} ({r['p50_ms']})" for r in mine))
        rps = [num(r["req_s"]) for r in mine if num(r["req_s"]) is not None]
        p50 = [num(r["p50_ms"]) for r in mine if num(r["p50_ms"]) is not None]
        if rps and p50: med[s] = (statistics.median(rps), statistics.median(p50))
    line = f"{p}: " + "; ".join(parts)
    if len(servers) > 1 and servers[0] in med and servers[-1] in med:
        (r0, l0), (r1, l1) = med[servers[0]], med[servers[-1]]
        line += (f"; {servers[-1]} / {servers[0]}: req/s x{r1 / r0:.3f},"
                 f" p50 {l1 - l0:+.3f} ms (medians)")
    print(line)
PY
}

# A table: SUITE, its default points, servers and rounds (each overridable).
table() {
  local suite=$1 points=$2 servers=$3 rounds=$4 entry round point
  log "== $suite"
  read -r -a bench_flags <<<"${BENCH_FLAGS:-}"
  read -r -a c1_bench_flags <<<"${C1_BENCH_FLAGS:-}"
  [ ${#bench_flags[@]} -gt 0 ] && log "matmul-bench flags: ${bench_flags[*]}"
  [ ${#c1_bench_flags[@]} -gt 0 ] && log "at c=1 besides: ${c1_bench_flags[*]}"
  # shellcheck disable=SC2086 # the points split on purpose
  ceiling "$suite" before $points
  for round in $(seq 1 "$rounds"); do
    for entry in $servers; do
      log "-- $entry, round $round"
      start_server "$logs/server-$suite-${entry//[^A-Za-z0-9_-]/_}-r$round.log" "$entry" || continue
      for point in $points; do
        run_point "$suite" "$entry" "$round" "$point"
      done
      stop_server
    done
  done
  # shellcheck disable=SC2086 # the points split on purpose
  ceiling "$suite" after $points
  figures "$suite"
}

tcp_points="tcp:256:1:1 tcp:256:64:16 tcp:64:64:8 tcp:1024:32:16 tcp:4096:16:16"
suite_bench() {
  table bench "${BENCH_POINTS:-$tcp_points shm:64:64:8 shm:256:64:16 stream:16384:1}" \
    "${SERVERS:-matmul-server}" "${ROUNDS:-1}"
}
suite_compare() {
  table compare "${COMPARE_POINTS:-$tcp_points}" \
    "${SERVERS:-matmul-server-before matmul-server}" "${ROUNDS:-2}"
}
suite_stored() {
  table stored "${STORED_POINTS:-resident:4096:8:8:float32:strict resident:4096:8:8:float32:tf32 resident:4096:8:8:bfloat16:strict}" \
    "${SERVERS:-matmul-server}" "${ROUNDS:-1}"
}

gpu="no nvidia-smi"
command -v nvidia-smi >/dev/null &&
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
log "== $(date -u +%FT%TZ) $gpu"
log "host: $(nproc) cores; engine $engine; suites: $*"
for suite in "$@"; do
  "suite_$suite"
done
log "== done $(date -u +%FT%TZ), ${SECONDS} s"
