#!/usr/bin/env bash
# The client's request encoding against throughput and latency on the H200,
# in one device call: one matmul-server (CUDA, defaults), and matmul-bench
# sending prebuilt zero-copy encodings (its default) or serializing with
# protobuf on every call (--protobuf-requests), alternating, three rounds,
# at n=256 c=1, n=1024 c=32 over 16 channels and n=64 c=64 over 8 channels.
# The transport ceilings for the same points run before and after.
# Expects matmul-server, matmul-bench, rawecho and rawclient in .gpubundle.
# Writes OUT/encoding.txt and the raw outputs.
#
#   scripts/gpu-client-encoding.sh OUT
set -u
out=${1:?usage: gpu-client-encoding.sh OUT}
R=.gpubundle/run
T=127.0.0.1:50051
log() { echo "$*" | tee -a "$out/encoding.txt"; }

ceiling() {
  $R rawecho 127.0.0.1:50061 >/dev/null 2>&1 &
  local e=$!
  sleep 1
  for point in "524288 1 1" "8388608 32 16" "32768 64 8"; do
    log "ceiling $point: $(timeout 20 $R rawclient 127.0.0.1:50061 $point 3 2>&1 | tail -1)"
  done
  kill $e
  wait $e 2>/dev/null
}

ceiling
$R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 0 \
  --engine cuda --pinned-pool-bytes 4294967296 2>"$out/server.log" &
s=$!
for _ in $(seq 1 300); do grep -q "serving on port" "$out/server.log" && break; sleep 0.1; done
for round in 1 2 3; do
  for mode in zero-copy protobuf; do
    args=()
    [ $mode = protobuf ] && args=(--protobuf-requests)
    log "== round $round, $mode ${args[*]}"
    for point in "256 1 1 4" "1024 32 16 3" "64 64 8 3"; do
      read -r n c ch secs <<<"$point"
      f="$out/bench-$mode-$round-n$n.txt"
      timeout 60 $R matmul-bench --target $T --shape "$n" --concurrency "$c" \
        --channels "$ch" --duration "$secs" --warmup 1 --timeout 30 "${args[@]}" >"$f" 2>&1
      grep -E "^ *[0-9]" "$f" | tee -a "$out/encoding.txt" || tail -n 3 "$f" | tee -a "$out/encoding.txt"
    done
  done
done
kill -TERM $s
for _ in $(seq 1 100); do kill -0 $s 2>/dev/null || break; sleep 0.1; done
ceiling
log "done"
