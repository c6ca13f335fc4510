#!/usr/bin/env bash
# The H200 benchmark run behind bench/LOG.md section 2, in one call of the
# device tool, server and bench in the same run as their ceilings:
#   1. gRPC transport ceilings (../shared/bench/transport-ceiling: a generic
#      callback server answering from a static buffer), TCP and unix socket;
#   2. the engine's pipeline in process (matmul-pipeline-bench, n=4096);
#   3. matmul-server on the GPU with matmul-bench sweeps: sizes x dtypes x
#      concurrency, the issue-8 target points, unix socket, stored tensors;
#   4. a /timeline capture and a /metrics scrape under load.
# Expects the programs in .gpubundle (scripts/gpu-bundle.sh); writes
# everything into one archive, $1/results.tgz, plus a summary on stdout.
#
#   scripts/gpu-bench.sh OUT [quick]
set -u
out=${1:?usage: gpu-bench.sh OUT [quick]}
quick=${2:-}
R=.gpubundle/run
work=$(mktemp -d)
secs=3
[ -n "$quick" ] && secs=1

# Progress goes to $out as it happens, so a run cut short still reports.
log() { echo "== $*" | tee -a "$work/summary.txt"; cp "$work/summary.txt" "$out/"; }
save() { cp "$work/summary.txt" "$out/"; tar czf "$out/results.tgz" -C "$work" .; }

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
  --format=csv >"$work/smi.txt" 2>&1
nproc >"$work/nproc.txt"

# 1. Transport ceilings.
log "transport ceiling (rawecho/rawclient)"
$R rawecho 127.0.0.1:50061 >"$work/rawecho.log" 2>&1 &
echo_pid=$!
sleep 1
target=127.0.0.1:50061
for point in "8388608 32 16" "32768 64 8" "524288 1 1"; do
  # shellcheck disable=SC2086
  line=$(timeout 30 $R rawclient "$target" $point "$secs" 2>&1 | tail -1)
  echo "$target $point: $line" | tee -a "$work/summary.txt"
done
kill "$echo_pid" 2>/dev/null
wait "$echo_pid" 2>/dev/null
save

# 2. The pipeline in process, for the cuBLAS ceilings of the same run.
log "pipeline bench"
[ -z "$quick" ] && timeout 180 $R matmul-pipeline-bench --sizes 4096 \
  --modes float32,tf32,bfloat16 \
  --seconds 1 --json "$work/pipeline.json" >"$work/pipeline.txt" 2>&1
tail -n 8 "$work/pipeline.txt" | tee -a "$work/summary.txt"

# 3. The service.
log "matmul-server"
$R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 9464 \
  --engine cuda --unix-socket /tmp/matmul.sock \
  --max-inflight-bytes 34359738368 --pinned-pool-bytes 17179869184 \
  --max-message-bytes 1073741824 2>"$work/server.log" &
server=$!
for _ in $(seq 1 600); do
  grep -q "serving on port" "$work/server.log" && break
  sleep 0.1
done
head -n 8 "$work/server.log" | tee -a "$work/summary.txt"

bench() {  # NAME ARGS...
  local name=$1
  shift
  timeout 90 $R matmul-bench --duration "$secs" --warmup 1 --timeout 30 \
    --json "$work/$name.json" --label "$name" "$@" >"$work/$name.txt" 2>&1
  echo "-- $name (rc=$?)" >>"$work/summary.txt"
  grep -E "^ *[0-9]" "$work/$name.txt" | tee -a "$work/summary.txt"
  save
}

T=127.0.0.1:50051
U=unix:/tmp/matmul.sock
for n in 256 1024 4096; do
  for dtype in float32 bfloat16; do
    verify=--verify
    [ "$n" = 4096 ] && verify=
    bench "sweep-n$n-$dtype" --target $T --shape "$n" --dtype "$dtype" \
      --concurrency 1,16,64 $verify
  done
done
# Issue 8 target points.
bench "n1024-c32-ch16" --target $T --shape 1024 --concurrency 32 --channels 16
bench "n1024-c32-unix" --target $U --shape 1024 --concurrency 32 --channels 16
bench "n64-c64" --target $T --shape 64 --concurrency 64 --channels 8 --verify
bench "n64-c64-unix" --target $U --shape 64 --concurrency 64 --channels 8
bench "n256-c1" --target $T --shape 256 --concurrency 1 --verify
# Small requests merged into batched GEMMs (a second server, same GPU).
$R matmul-server --host 127.0.0.1 --port 50052 --metrics-port 0 \
  --engine cuda --batch-window-us 100 --pinned-pool-bytes 1073741824 \
  2>"$work/server-batching.log" &
batching=$!
for _ in $(seq 1 300); do
  grep -q "serving on port" "$work/server-batching.log" && break
  sleep 0.1
done
bench "batched-n64-c64" --target 127.0.0.1:50052 --shape 64 --concurrency 64 \
  --channels 8 --verify
bench "batched-n256-c64" --target 127.0.0.1:50052 --shape 256 \
  --concurrency 64 --channels 8
kill -TERM "$batching"
wait "$batching"
# Stored operands and kept results: the GPU, not the wire, is the limit.
for mode in "float32 strict" "float32 tf32" "bfloat16 strict"; do
  # shellcheck disable=SC2086 # mode is a dtype and a compute mode, split on purpose
  set -- $mode
  ( sleep 2; python3 -c "import urllib.request,sys; \
sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/timeline?seconds=1').read().decode())" \
      >"$work/timeline-resident-$1-$2.json" 2>/dev/null ) &
  capture=$!
  bench "resident-n4096-$1-$2" --target $T --shape 4096 --dtype "$1" \
    --compute "$2" --concurrency 8,16 --resident
  wait "$capture"  # not a bare wait: the server is a child too
done
( sleep 2; python3 -c "import urllib.request,sys; \
sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/timeline?seconds=1').read().decode())" \
    >"$work/timeline-n4096.json" 2>/dev/null ) &
capture=$!
bench "timeline-n4096-f32" --target $T --shape 4096 --concurrency 8
wait "$capture"
python3 -c "import urllib.request,sys; \
sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode())" \
  >"$work/metrics.txt" 2>/dev/null
grep -E "^matmul_(device_busy|device_copy_compute|stream_busy)_seconds_total" \
  "$work/metrics.txt" | head -n 12 | tee -a "$work/summary.txt"

kill -TERM "$server"
wait "$server"
echo "server exit: $?" | tee -a "$work/summary.txt"
tail -n 3 "$work/server.log" >>"$work/summary.txt"
save
