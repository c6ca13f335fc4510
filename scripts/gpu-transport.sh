#!/usr/bin/env bash
# Transport tuning on the H200, in one device call: the same workloads with
# gRPC's defaults and with larger HTTP/2 windows and frames (--grpc-arg on
# the server and on the clients), alternating, two rounds:
#   matmul-bench n=1024 float32, 32 concurrent over 16 channels (throughput);
#   matmul-bench n=256 float32, one at a time (latency);
#   matmul-cli --stream, one 16384² float32 multiply (one connection).
# Expects matmul-server, matmul-bench and matmul-cli in .gpubundle and
# python3 with numpy. Writes OUT/transport.txt.
#
#   scripts/gpu-transport.sh OUT
set -u
out=${1:?usage: gpu-transport.sh OUT}
R=.gpubundle/run
data=$(mktemp -d)
T=127.0.0.1:50051
tuned="grpc.http2.lookahead_bytes=67108864,grpc.http2.max_frame_size=16777215"
log() { echo "$*" | tee -a "$out/transport.txt"; }

python3 - "$data" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(1)
for name in ("a", "b"):
    np.save(f"{sys.argv[1]}/{name}.npy", rng.standard_normal((16384, 16384), dtype=np.float32))
PY
for round in 1 2; do
  for cfg in default tuned; do
    args=()
    [ $cfg = tuned ] && args=(--grpc-arg "$tuned")
    $R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 0 \
      --engine cuda --pinned-pool-bytes 4294967296 "${args[@]}" 2>"$out/server-$cfg-$round.log" &
    s=$!
    for _ in $(seq 1 300); do grep -q "serving on port" "$out/server-$cfg-$round.log" && break; sleep 0.1; done
    log "== round $round, $cfg ${args[*]}"
    for point in "1024 32 16" "256 1 1"; do
      read -r n c ch <<<"$point"
      f="$out/bench-$cfg-$round-$n.txt"
      timeout 30 $R matmul-bench --target $T --shape "$n" --concurrency "$c" \
        --channels "$ch" --duration 2 --warmup 1 --timeout 30 "${args[@]}" >"$f" 2>&1
      grep -E "^ *[0-9]" "$f" | tee -a "$out/transport.txt" || tail -n 3 "$f" | tee -a "$out/transport.txt"
    done
    timeout 60 $R matmul-cli multiply --target $T --a "$data/a.npy" --b "$data/b.npy" \
      --out "$data/c.npy" --stream --chunk-mib 4 "${args[@]}" 2>&1 | tee -a "$out/transport.txt"
    grep "stream request" "$out/server-$cfg-$round.log" | tail -1 | tee -a "$out/transport.txt"
    kill -TERM $s
    for _ in $(seq 1 100); do kill -0 $s 2>/dev/null || break; sleep 0.1; done
  done
done
rm -rf "$data"
log "done"
