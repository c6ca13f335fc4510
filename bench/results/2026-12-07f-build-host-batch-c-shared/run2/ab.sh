#!/bin/bash
# Host engine, build machine: matmul-server from c436b1e ("before"), this
# commit with default flags ("default") and with --batch-c-shared ("batched"),
# in turn, three rounds; matmul-bench through shared memory on the same
# machine (a Unix socket), n=64 and n=256 at c=64, and n=64 at c=1 and c=8.
set -u
OUT=${OUT:-/tmp/shm3}
BEFORE=${BEFORE:-/tmp/before/build/bin/matmul-server}
AFTER=${AFTER:-build/bin/matmul-server}
BENCH=${BENCH:-build/bin/matmul-bench}
for round in 1 2 3; do
  for which in before default batched; do
    sock=/tmp/mm_ab_$which.sock; rm -f "$sock"
    case $which in
      before) cmd=("$BEFORE") ;;
      default) cmd=("$AFTER") ;;
      batched) cmd=("$AFTER" --batch-c-shared) ;;
    esac
    "${cmd[@]}" --engine=host --host=127.0.0.1 --port=0 --unix-socket="$sock" \
      --metrics-port=19997 > "$OUT/server_${which}_$round.log" 2>&1 &
    pid=$!
    for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
    for shape in 64 256; do
      timeout 60 "$BENCH" --target "unix:$sock" --shared-memory --shape $shape \
        --concurrency 64 --duration 3 --warmup 1 --verify \
        --json "$OUT/${which}_n${shape}_c64_$round.json" > "$OUT/${which}_n${shape}_c64_$round.txt" 2>&1
    done
    timeout 60 "$BENCH" --target "unix:$sock" --shared-memory --shape 64 \
      --concurrency 1,8 --duration 3 --warmup 1 --verify \
      --json "$OUT/${which}_n64_c1c8_$round.json" > "$OUT/${which}_n64_c1c8_$round.txt" 2>&1
    echo "$which $round $(curl -s 127.0.0.1:19997/metrics | grep -E '^matmul_batch_size_(sum|count)' | tr '\n' ' ')"
    kill -INT $pid; wait $pid
  done
done
