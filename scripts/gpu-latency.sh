#!/usr/bin/env bash
# Where an n=256 float32 request's time goes on the H200, in one device call:
# the transport ceiling for the same sizes (../shared/bench/transport-ceiling,
# 512 KiB request, 256 KiB reply, one call in flight), matmul-bench at
# concurrency 1, then the server's stage histograms (sums and counts) from
# /metrics. Expects matmul-server, matmul-bench, rawecho and rawclient in
# .gpubundle. Writes OUT/lat.txt and the raw outputs.
#
#   scripts/gpu-latency.sh OUT
set -u
out=${1:?usage: gpu-latency.sh OUT}
R=.gpubundle/run
$R rawecho 127.0.0.1:50061 > /dev/null 2>&1 & e=$!
sleep 1
for i in 1 2 3; do echo "ceiling: $(timeout 20 $R rawclient 127.0.0.1:50061 524288 1 1 3 2>&1 | tail -1)" | tee -a "$out/lat.txt"; done
kill "$e"
$R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 9464 --engine cuda --pinned-pool-bytes 1073741824 2> "$out/server.log" &
s=$!
for _ in $(seq 1 300); do grep -q "serving on port" "$out/server.log" && break; sleep 0.1; done
for i in 1 2; do
  timeout 60 $R matmul-bench --target 127.0.0.1:50051 --shape 256 --dtype float32 --concurrency 1 --duration 4 --warmup 1 --timeout 30 > "$out/bench$i.txt" 2>&1
  grep -E "^ *[0-9]" "$out/bench$i.txt" | tee -a "$out/lat.txt"
done
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode())" > "$out/metrics.txt"
grep -E "^matmul_(stage_duration_seconds|request_duration_seconds)_(sum|count)" "$out/metrics.txt" | grep -v 'method="[^M]' | tee -a "$out/lat.txt"
kill -TERM "$s"; sleep 1
