#!/bin/bash
# A/B: host-engine servers before (c436b1e) and after (4341672), alternating.
set -u
OUT=/tmp/shmab
declare -A BIN=([before]=/tmp/before/build/bin/matmul-server [after]=/work/main/build/bin/matmul-server)
BENCH=/work/main/build/bin/matmul-bench
for round in 1 2 3; do
  for which in before after; do
    sock=/tmp/shmab_$which.sock; rm -f $sock
    ${BIN[$which]} --engine=host --host=127.0.0.1 --port=0 --unix-socket=$sock --metrics-port=19997 > $OUT/server_${which}_$round.log 2>&1 &
    pid=$!
    for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
    for shape in 64 256; do
      timeout 60 $BENCH --target unix:$sock --shared-memory --shape $shape --concurrency 64 --duration 3 --warmup 1 --verify --json $OUT/${which}_${shape}_$round.json > $OUT/bench_${which}_${shape}_$round.txt 2>&1
      echo "$which round $round shape $shape: $(grep -E 'req/s' $OUT/bench_${which}_${shape}_$round.txt | tail -1)"
    done
    curl -s 127.0.0.1:19997/metrics | grep -E '^matmul_batch_size_(sum|count)' | tr '\n' ' '; echo
    kill -INT $pid; wait $pid
  done
done
