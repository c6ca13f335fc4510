#!/usr/bin/env bash
# The H200 run behind bench/LOG.md section 3 (MultiplyStream), in one
# call of the device tool:
#   1. one 16384 x 16384 float32 multiply (2 GiB of operands, 1 GiB product)
#      through matmul-cli --stream at three chunk sizes, each product checked
#      at sampled entries against float64 dot products, with the server's
#      /timeline captured after the first run;
#   2. the same CLI at 8192 (256 MiB operands): unary Multiply beside
#      MultiplyStream, same files, same server;
#   3. the GPU tests (cuda_engine_test; multiply_stream_test and server_test
#      with MATMUL_TEST_ENGINE=cuda).
# Expects matmul-server, matmul-cli and the test binaries in .gpubundle
# (../shared/tools/gpu-bundle) and python3 with numpy. Progress goes to
# OUT/summary.txt as it happens; logs to OUT/logs.tgz.
#
#   scripts/gpu-stream.sh OUT
#   STRIPES="1 2 4 8" scripts/gpu-stream.sh OUT   step 1 at each --stripes K
#     (one multiply striped over K MultiplyStream calls on K connections);
#     default "1": one stream, as before. MATMUL_STREAM_CHUNKS="16" narrows
#     step 1's chunk sizes (default "4 16 64").
# A smoke run without a GPU: MATMUL_STREAM_N=512 MATMUL_STREAM_MID=256
#   MATMUL_STREAM_ENGINE=host MATMUL_RUN=env PATH=build/bin:$PATH ...
set -u
out=${1:?usage: gpu-stream.sh OUT}
R=${MATMUL_RUN:-.gpubundle/run}
big=${MATMUL_STREAM_N:-16384}
mid=${MATMUL_STREAM_MID:-8192}
engine=${MATMUL_STREAM_ENGINE:-cuda}
stripes_list=${STRIPES:-1}
chunks_list=${MATMUL_STREAM_CHUNKS:-4 16 64}
work=$(mktemp -d)
data=$(mktemp -d)

log() { echo "$*" | tee -a "$out/summary.txt"; }
summary() {  # a gtest log's totals
  echo "$(grep -E '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$1" | tr '\n' ' ')" \
    "skipped: $(grep -cE '^\[  SKIPPED \] .*\(' "$1")"
}
save() { tar czf "$out/logs.tgz" -C "$work" . 2>/dev/null; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  | tee -a "$out/summary.txt"
log "host: $(nproc) cores, $(date -u +%FT%TZ)"

gen() {  # N NAME SEED
  python3 - "$1" "$data/$2.npy" "$3" <<'EOF'
import sys, numpy as np
n, path, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
np.save(path, rng.standard_normal((n, n), dtype=np.float32))
EOF
}

check() {  # A B C: sampled entries of C against float64 dot products
  python3 - "$1" "$2" "$3" <<'EOF'
import sys, numpy as np
a = np.load(sys.argv[1], mmap_mode="r")
b = np.load(sys.argv[2])
c = np.load(sys.argv[3], mmap_mode="r")
assert c.shape == (a.shape[0], b.shape[1]) and c.dtype == np.float32, c.shape
rng = np.random.default_rng(1)
rows = rng.integers(0, a.shape[0], 64)
cols = rng.integers(0, b.shape[1], 64)
worst = 0.0
for i, j in zip(rows, cols):
    x = a[i].astype(np.float64)
    y = np.asarray(b[:, j], dtype=np.float64)
    ref = x @ y
    scale = np.linalg.norm(x) * np.linalg.norm(y)
    worst = max(worst, abs(float(c[i, j]) - ref) / scale)
# The last entry and the first, where chunk edges meet the ends.
for i, j in ((0, 0), (a.shape[0] - 1, b.shape[1] - 1)):
    x = a[i].astype(np.float64)
    y = np.asarray(b[:, j], dtype=np.float64)
    worst = max(worst, abs(float(c[i, j]) - x @ y) /
                (np.linalg.norm(x) * np.linalg.norm(y)))
nan = int(np.isnan(c[rows, :]).sum())
print(f"sampled 66 entries: worst |c-ref|/(|a_i||b_j|) = {worst:.2e}; "
      f"NaN in 64 sampled rows: {nan}; {'OK' if worst < 1e-5 and nan == 0 else 'BAD'}")
EOF
}

# The yardstick: what one gRPC connection moves with big messages (the
# stream uses one), from ../shared/bench/transport-ceiling when bundled.
if [ -x .gpubundle/bin/rawecho ]; then
  log "== transport ceiling, one connection, 8 MiB requests (4 MiB replies)"
  $R rawecho 127.0.0.1:50061 >"$work/rawecho.log" 2>&1 &
  echo_pid=$!
  sleep 1
  for threads in 1 1 8 8; do
    # shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
    log "rawclient 8388608 $threads threads 1 channel: $(timeout 30 $R rawclient 127.0.0.1:50061 8388608 "$threads" 1 3 2>&1 | tail -1)"
  done
  kill "$echo_pid"
fi

log "== generating operands"
gen "$big" a16k 1 && gen "$big" b16k 2 && gen "$mid" a8k 3 && gen "$mid" b8k 4
# shellcheck disable=SC2012 # a listing for the summary, not parsed
ls -la "$data" | tee -a "$out/summary.txt"

$R matmul-server --host 127.0.0.1 --port 50051 --metrics-port 9464 \
  --engine "$engine" --pinned-pool-bytes 4294967296 \
  --max-message-bytes 1073741824 2>"$work/server.log" &
server=$!
for _ in $(seq 1 600); do
  grep -q "serving on port" "$work/server.log" && break
  sleep 0.1
done
head -n 6 "$work/server.log" | tee -a "$out/summary.txt"
T=127.0.0.1:50051

log "== ${big}^2 float32 over MultiplyStream"
first=1
for k in $stripes_list; do
for mib in $chunks_list; do
  striping=()
  if [ "$k" != 1 ]; then
    striping=(--stripes "$k")
    log "-- --stripes $k --chunk-mib $mib"
  fi
  # shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
  timeout 120 $R matmul-cli multiply --target $T --a "$data/a16k.npy" \
    --b "$data/b16k.npy" --out "$data/c16k.npy" --stream --chunk-mib "$mib" \
    ${striping[@]+"${striping[@]}"} 2>&1 | tee -a "$out/summary.txt"
  if [ $first = 1 ]; then
    python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/timeline?seconds=20').read().decode())" \
      >"$out/timeline-16k.json" 2>>"$out/summary.txt"
    first=0
  fi
  timeout 120 bash -c "$(declare -f check); check $data/a16k.npy $data/b16k.npy $data/c16k.npy" \
    2>&1 | tee -a "$out/summary.txt"
  rm -f "$data/c16k.npy"
  grep "stream request" "$work/server.log" | tail -1 | tee -a "$out/summary.txt"
  save
done
done

log "== ${mid}^2 float32: unary Multiply vs MultiplyStream"
for _ in 1 2 3; do
  # shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
  timeout 60 $R matmul-cli multiply --target $T --a "$data/a8k.npy" \
    --b "$data/b8k.npy" --out "$data/c8k.npy" 2>&1 | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
  timeout 60 $R matmul-cli multiply --target $T --a "$data/a8k.npy" \
    --b "$data/b8k.npy" --out "$data/c8k-s.npy" --stream --chunk-mib 16 \
    2>&1 | tee -a "$out/summary.txt"
done
python3 -c "
import numpy as np
u = np.load('$data/c8k.npy'); s = np.load('$data/c8k-s.npy')
print('$mid: streamed product identical to unary:', bool((u == s).all()))" \
  2>&1 | tee -a "$out/summary.txt"
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:9464/metrics').read().decode())" \
  >"$work/metrics.txt" 2>&1
grep -E '^matmul_requests_total.*MultiplyStream' "$work/metrics.txt" | tee -a "$out/summary.txt"
kill -TERM "$server"
for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
rm -rf "$data"
save

if [ "${MATMUL_STREAM_TESTS:-1}" = 0 ]; then log "done"; exit 0; fi
log "== GPU tests"
# shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
timeout 240 $R cuda_engine_test >"$work/cuda_engine_test.log" 2>&1
log "cuda_engine_test rc=$? $(summary "$work/cuda_engine_test.log")"
grep -E '^\[  FAILED  \]' "$work/cuda_engine_test.log" | head | tee -a "$out/summary.txt"
save
# shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
MATMUL_TEST_ENGINE=cuda timeout 120 $R multiply_stream_test \
  >"$work/multiply_stream_test.log" 2>&1
log "multiply_stream_test (cuda) rc=$? $(summary "$work/multiply_stream_test.log")"
save
# shellcheck disable=SC2086 # $R (MATMUL_RUN) splits as in the other $R calls
MATMUL_TEST_ENGINE=cuda timeout 200 $R server_test >"$work/server_test.log" 2>&1
log "server_test (cuda) rc=$? $(summary "$work/server_test.log")"
grep -E '^\[  FAILED  \]' "$work/server_test.log" | head | tee -a "$out/summary.txt"
save

log "== soak on the CUDA engine (60 s)"
if [ -d build/python ]; then
  LD_LIBRARY_PATH="$PWD/.gpubundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
    MATMUL_BIN_DIR="$PWD/.gpubundle/bin" PYTHONPATH="$PWD/build/python" \
    MATMUL_SOAK_ENGINE=cuda MATMUL_SOAK_SECONDS=60 \
    MATMUL_SOAK_REPORT="$out/soak-cuda.json" \
    timeout 170 python3 -m pytest -q -p no:cacheprovider tests/soak \
    >"$work/soak.log" 2>&1
  log "soak rc=$? $(tail -n 1 "$work/soak.log")"
  save
fi
log "done"
