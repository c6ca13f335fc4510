"""Memory comes back: after heavy load ends, the server's RSS returns near
what it was before the load.

A real matmul-server (host engine, MALLOC_ARENA_MAX=2 as the image sets it)
takes two passes of matmul-bench with 240 requests in flight over 16
connections (256x256x256 float32), each bench killed with SIGKILL after
PASS_SECONDS (the kill -9 rounds of a client that vanishes mid-call). Then,
within SETTLE_SECONDS, in-flight work is 0 and RSS is within RSS_SLACK of the
figure before the load.

glibc keeps freed memory in its arenas: without the server's idle trim
(--trim-memory-after=0) RSS stays about 200 MiB above the start after such
load (172 -> 400 MiB on a 2-core machine); see server/idle_memory_trimmer.h.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import SoakServer

PASSES = 2
PASS_SECONDS = 10
SETTLE_SECONDS = 30
RSS_SLACK_BYTES = 64 << 20


def _bench_binary() -> Path:
    root = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("MATMUL_BIN_DIR", root / "build" / "bin")) / "matmul-bench"
    if not path.is_file():
        pytest.fail(f"{path} not found: build matmul-bench or set MATMUL_BIN_DIR")
    return path


def _inflight(server: SoakServer) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    match = re.search(r"^matmul_inflight_requests(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    assert match, "no matmul_inflight_requests in /metrics"
    return float(match.group(1))


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def test_rss_returns_after_load() -> None:
    if "ASAN_OPTIONS" in os.environ:
        # AddressSanitizer replaces malloc: what this measures is glibc's
        # allocator and the server's malloc_trim, which do not run there.
        pytest.skip("under AddressSanitizer the server's heap is ASan's, not glibc's")
    # $MATMUL_MEMORY_TEST_SERVER_FLAGS: extra server flags, e.g.
    # "--trim-memory-after=0" to see the test fail without the idle trim.
    server = SoakServer("host", *os.environ.get("MATMUL_MEMORY_TEST_SERVER_FLAGS", "").split())
    try:
        baseline = server.rss_bytes()
        peak = baseline
        for _ in range(PASSES):
            bench = subprocess.Popen(
                [str(_bench_binary()), "--target", server.target, "--shape", "256",
                 "--concurrency", "240", "--channels", "16", "--warmup", "0",
                 "--duration", str(PASS_SECONDS * 6)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + PASS_SECONDS
            while time.monotonic() < deadline and bench.poll() is None:
                time.sleep(0.5)
                peak = max(peak, server.rss_bytes())
            assert bench.poll() is None, "matmul-bench ended before it was killed"
            bench.send_signal(signal.SIGKILL)
            bench.wait()
        loaded = server.rss_bytes()
        settled_at = None
        deadline = time.monotonic() + SETTLE_SECONDS
        started = time.monotonic()
        while time.monotonic() < deadline:
            if _inflight(server) == 0 and server.rss_bytes() <= baseline + RSS_SLACK_BYTES:
                settled_at = time.monotonic() - started
                break
            time.sleep(0.5)
        after = server.rss_bytes()
        print(f"RSS before the load {_mib(baseline)}, peak {_mib(peak)}, when the last "
              f"client was killed {_mib(loaded)}, then {_mib(after)}"
              + (f" after {settled_at:.1f} s" if settled_at is not None else
                 f" after {SETTLE_SECONDS} s (not settled)"))
        assert _inflight(server) == 0
        assert after <= baseline + RSS_SLACK_BYTES, (
            f"RSS {_mib(after)} is more than {_mib(RSS_SLACK_BYTES)} above the "
            f"{_mib(baseline)} before the load, {SETTLE_SECONDS} s after it ended")
        assert server.alive()
    finally:
        status = server.stop()
    assert status == 0, f"matmul-server exited with {status}:\n{server.output()}"
