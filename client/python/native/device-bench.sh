#!/usr/bin/env bash
# The Python client against matmul-bench on a GPU host, one server, same run:
#   client/python/native/device-bench.sh OUT [SHAPES] [SECONDS]
# Expects .gpubundle (matmul-server, matmul-bench and their libraries) and
# the package at $PKG (default build/python) with a _native built for this
# python3 (kit.sh build); without it only the --pure rows run. Writes
# OUT/bench.txt.
set -u
out=$1; shapes=${2:-256,1024,4096}; secs=${3:-5}
pkg=$(cd "${PKG:-build/python}" && pwd)
R=.gpubundle/run
py=${PYTHON:-python3}
T=127.0.0.1:50051
mkdir -p "$out"
$R matmul-server --host 127.0.0.1 --port 50051 --engine "${ENGINE:-cuda}" 2>"$out/server.log" &
server=$!
for _ in $(seq 1 300); do grep -q "serving on port" "$out/server.log" && break; sleep 0.1; done
export LD_LIBRARY_PATH="$PWD/.gpubundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PYTHONPATH=$pkg PYTHONUNBUFFERED=1
{
  echo "== $(date -u) $(nvidia-smi -L 2>/dev/null | head -1) python: $("$py" --version)"
  "$py" -c 'from matmul_client import _client; print("native:", _client.NATIVE_UNAVAILABLE or "available")'
  for n in ${shapes//,/ }; do
    echo "== n=$n"
    timeout 120 $R matmul-bench --target $T --shape "$n" --concurrency 1,8 --duration "$secs" 2>&1 | tail -3
    timeout 120 $R matmul-bench --target $T --shape "$n" --concurrency 8 --channels 1 --duration "$secs" 2>&1 | tail -1
    timeout 120 "$py" -m matmul_client.bench --target $T --shape "$n" --concurrency 1,8 --duration "$secs"
    timeout 120 "$py" -m matmul_client.bench --target $T --shape "$n" --concurrency 8 --clients 8 --duration "$secs" | tail -1
    timeout 120 "$py" -m matmul_client.bench --target $T --shape "$n" --concurrency 1,8 --duration "$secs" --aio | tail -2
    timeout 120 "$py" -m matmul_client.bench --target $T --shape "$n" --concurrency 1,8 --duration "$secs" --pure | tail -2
  done
} 2>&1 | tee "$out/bench.txt"
kill -TERM $server; wait $server
