"""Memory comes back on the CUDA engine: after a mixed load (unary multiplies
of several shapes over TCP, MultiplyStream, operands and products in shared
memory over the Unix socket), the server's RSS returns near what it was
before the load, the pinned pool counted in both.

Needs a GPU: skips where there is none (CI). On a GPU host:

    MATMUL_BIN_DIR=build/bin PYTHONPATH=build/python \\
      python3 -m pytest -q -s tests/soak/gpu_memory_test.py

MATMUL_GPU_MEMORY_LOAD_SECONDS sets the load's length (default 60).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import SoakServer
from memory_test import _bench_binary, _inflight, _mib

LOAD_SECONDS = float(os.environ.get("MATMUL_GPU_MEMORY_LOAD_SECONDS", "60"))
SETTLE_SECONDS = 10
RSS_SLACK_BYTES = 64 << 20


def _have_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None or not Path("/dev/nvidiactl").exists():
        return False
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    return listed.returncode == 0 and "GPU" in listed.stdout


def test_cuda_rss_returns_after_mixed_load() -> None:
    if not _have_gpu():
        pytest.skip("no GPU here: the CUDA engine's memory is measured on a GPU host")
    if "ASAN_OPTIONS" in os.environ:
        pytest.skip("under AddressSanitizer the server's heap is ASan's, not glibc's")
    socket_dir = tempfile.mkdtemp(prefix="matmul-gpu-memory-")
    socket_path = os.path.join(socket_dir, "matmul.sock")
    server = SoakServer("cuda", "--unix-socket", socket_path)
    try:
        time.sleep(2)
        baseline = server.rss_bytes()
        bench = str(_bench_binary())
        common = ["--duration", str(LOAD_SECONDS), "--warmup", "0", "--timeout", "120"]
        loads = {
            "unary": [bench, "--target", server.target, "--shape-mix", "64,256,1024",
                      "--concurrency", "32", "--channels", "8", *common],
            "streamed": [bench, "--target", server.target, "--stream", "--shape", "4096",
                         "--concurrency", "2", *common],
            "shared memory": [bench, "--target", f"unix:{socket_path}", "--shared-memory",
                              "--shape", "256", "--concurrency", "16", "--channels", "4",
                              *common],
        }
        running = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True)
                   for name, argv in loads.items()}
        peak = baseline
        while any(p.poll() is None for p in running.values()):
            peak = max(peak, server.rss_bytes())
            time.sleep(0.5)
        for name, p in running.items():
            output = p.stdout.read() if p.stdout else ""
            assert p.returncode == 0, f"the {name} load failed:\n{output[-2000:]}"
        loaded = server.rss_bytes()
        time.sleep(SETTLE_SECONDS)
        after = server.rss_bytes()
        print(f"CUDA engine RSS before the load {_mib(baseline)}, peak {_mib(peak)}, "
              f"when it ended {_mib(loaded)}, {SETTLE_SECONDS} s later {_mib(after)}")
        assert _inflight(server) == 0
        assert after <= baseline + RSS_SLACK_BYTES, (
            f"RSS {_mib(after)} is more than {_mib(RSS_SLACK_BYTES)} above the "
            f"{_mib(baseline)} before the load, {SETTLE_SECONDS} s after it ended")
        assert server.alive()
    finally:
        status = server.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert status == 0, f"matmul-server exited with {status}:\n{server.output()}"
