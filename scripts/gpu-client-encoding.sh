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
logfile=encoding.txt
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

points=("524288 1 1" "8388608 32 16" "32768 64 8")
ceiling "${points[@]}"
start_server "$out/server.log" --metrics-port 0
for round in 1 2 3; do
  for mode in zero-copy protobuf; do
    args=()
    [ $mode = protobuf ] && args=(--protobuf-requests)
    log "== round $round, $mode ${args[*]}"
    for point in "256 1 1 4" "1024 32 16 3" "64 64 8 3"; do
      read -r n c ch secs <<<"$point"
      bench_point "$out/bench-$mode-$round-n$n.txt" "$n" "$c" "$ch" "$secs" "${args[@]}"
    done
  done
done
stop_server
ceiling "${points[@]}"
log "done"
