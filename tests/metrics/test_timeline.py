"""GET /timeline of a host-engine matmul-server: Chrome trace JSON with one
complete event per stream span; bench/tools/render_timeline.py turns it (and a
GPU-shaped trace) into a PNG swimlane chart."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

import matmul_client

from metrics_helpers import REPO_ROOT, http_get

RENDER = REPO_ROOT / "bench" / "tools" / "render_timeline.py"


def png_size(path: Path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def render(trace_path: Path, png: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RENDER), str(trace_path), "-o", str(png), *extra],
                          capture_output=True, text=True, timeout=60)


def test_timeline_of_host_engine_is_valid_and_renders(server, tmp_path):
    def work():
        a = np.ones((96, 96), np.float32)
        with matmul_client.Client(server.target, timeout=30) as client:
            for _ in range(8):
                client.multiply(a, a)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    status, content_type, body = http_get(server.metrics_url + "/timeline?seconds=30")
    assert status == 200, body
    assert content_type.startswith("application/json")
    trace = json.loads(body)
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["engine"] == "host"
    assert trace["otherData"]["window_seconds"] == 30
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert len(spans) >= 24, f"{len(spans)} spans for 24 products"
    assert trace["otherData"]["spans"] == len(spans)
    lanes = {e["tid"] for e in meta if e["name"] == "thread_name"}
    assert lanes == {0, 1, 2, 3}
    assert any(e["name"] == "process_name" and e["args"]["name"].startswith("host")
               for e in meta)
    jobs = set()
    for e in spans:
        assert e["name"] == "gemm" and e["cat"] == "compute"  # host: no copies
        assert e["pid"] == 0 and e["tid"] in lanes
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["args"]["job"], int)
        jobs.add(e["args"]["job"])
    assert len(jobs) == len(spans), "one GEMM span per job"
    assert min(e["ts"] for e in spans) == 0
    # The window is honoured: a tiny window right after a pause is empty
    # or nearly so, never larger than the long one.
    short = json.loads(http_get(server.metrics_url + "/timeline?seconds=0.001")[2])
    assert len([e for e in short["traceEvents"] if e["ph"] == "X"]) <= len(spans)

    trace_path = tmp_path / "host.json"
    trace_path.write_text(body)
    png = tmp_path / "host.png"
    result = render(trace_path, png)
    assert result.returncode == 0, result.stderr
    width, height = png_size(png)
    assert width == 1440 and height > 100


def test_timeline_rejects_bad_windows(server):
    status, _, body = http_get(server.metrics_url + "/timeline?seconds=never")
    assert status == 400 and "positive number" in body
    status, _, body = http_get(server.metrics_url + "/timeline?seconds=99999")
    assert status == 200 and json.loads(body)["otherData"]["window_seconds"] == 60


def test_render_gpu_shaped_trace(tmp_path):
    """Two GPUs x 4 streams with overlapping H2D / GEMM / D2H, as the CUDA
    engine reports them; also read from stdin."""
    events = []
    for pid in (0, 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"GPU {pid}: NVIDIA H200"}})
        for tid in range(4):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": f"stream {tid}"}})
            t = 100.0 * tid
            for job in range(5):
                for name, dur in (("h2d", 150.0), ("gemm", 300.0), ("d2h", 80.0)):
                    events.append({"ph": "X", "name": name,
                                   "cat": "compute" if name == "gemm" else "copy",
                                   "pid": pid, "tid": tid, "ts": t, "dur": dur,
                                   "args": {"job": job * 8 + pid * 4 + tid}})
                    t += dur
    trace = {"traceEvents": events, "displayTimeUnit": "ms",
             "otherData": {"engine": "cuda", "window_seconds": 2}}
    png = tmp_path / "gpu.png"
    result = subprocess.run([sys.executable, str(RENDER), "-", "-o", str(png),
                             "--width", "10"],
                            input=json.dumps(trace), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    width, height = png_size(png)
    assert width == 1200 and height > 8 * 0.32 * 120


def test_render_reports_unreadable_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = render(bad, tmp_path / "x.png")
    assert result.returncode == 1 and "render_timeline" in result.stderr
