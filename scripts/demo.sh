#!/usr/bin/env bash
# Installs what is missing (no Node tools: those are the deploy checks'),
# builds the server, matmul-cli, matmul-bench and the Python package (what
# README.md then uses), starts matmul-server on the default engine (CUDA where
# there is a GPU, the host engine elsewhere), multiplies two random matrices
# through matmul-cli and checks the answer against NumPy.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
scripts/install-deps.sh --build
# The same configuration as scripts/test.sh's main build, so that either may
# run first in a clone and the other reuses build/ (only the user-facing
# targets here).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBUILD_TESTING=ON -DMATMUL_WERROR=ON -DMATMUL_SANITIZE= -DMATMUL_FUZZ=OFF >/dev/null
cmake --build "$build" --target matmul-server matmul-cli matmul-bench matmul_python

work=$(mktemp -d)
log="$work/server.log"
"$build/bin/matmul-server" --host 127.0.0.1 --port 0 --metrics-port 0 2>"$log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not start"; cat "$log"; exit 1; }
cat "$log"

/usr/bin/python3 - "$work" <<'PY'
import sys, numpy as np
rng = np.random.default_rng()
np.save(f"{sys.argv[1]}/a.npy", rng.standard_normal((512, 384), dtype=np.float32))
np.save(f"{sys.argv[1]}/b.npy", rng.standard_normal((384, 256), dtype=np.float32))
PY

"$build/bin/matmul-cli" info --target "127.0.0.1:$port"
"$build/bin/matmul-cli" multiply --target "127.0.0.1:$port" \
  --a "$work/a.npy" --b "$work/b.npy" --out "$work/c.npy"

/usr/bin/python3 - "$work" <<'PY'
import sys, numpy as np
d = sys.argv[1]
a, b, c = (np.load(f"{d}/{n}.npy") for n in "abc")
ref = a.astype(np.float64) @ b.astype(np.float64)
err = np.linalg.norm(c - ref) / np.linalg.norm(ref)
print(f"check against NumPy: C is {c.shape} {c.dtype}, relative error {err:.2e}",
      "OK" if err < 1e-5 else "WRONG")
sys.exit(0 if err < 1e-5 else 1)
PY
