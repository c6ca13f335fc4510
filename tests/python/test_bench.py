"""python -m matmul_client.bench: runs on both engines against a real server
and reports every point it was asked for, with successful requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ENGINES


@pytest.mark.parametrize("engine", ENGINES)
def test_bench_reports_each_point(server, engine: str, tmp_path: Path) -> None:
    if engine == "native":
        from matmul_client import _client

        if _client.NATIVE_UNAVAILABLE is not None:
            pytest.skip(f"native engine: {_client.NATIVE_UNAVAILABLE}")
    out = tmp_path / "points.json"
    command = [sys.executable, "-m", "matmul_client.bench", "--target", server.target,
               "--shape", "8,16", "--concurrency", "1,3", "--duration", "0.3", "--warmup", "0.05",
               "--json", str(out)] + (["--pure"] if engine == "pure" else [])
    for call, flag in (
        ("multiply", []),
        ("streamed", ["--streamed"]),
        ("streamed", ["--streamed", "--stripes", "2"]),
        ("aio", ["--aio"]),
    ):
        run = subprocess.run(command + flag, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        rows = [line.split() for line in run.stdout.splitlines()[1:]]
        assert [(r[0], r[2], r[3]) for r in rows] == [
            (engine, shape, conc) for shape in ("8", "16") for conc in ("1", "3")
        ]
        points = json.loads(out.read_text())["points"]
        assert len(points) == 4
        for point in points:
            assert point["engine"] == engine
            assert point["call"] == call
            if call != "aio":
                assert point["stripes"] == (2 if "--stripes" in flag else 1)
            assert point["requests"] > 0 and point["errors"] == {}
            assert 0 < point["p50_ms"] <= point["p99_ms"]


def test_bench_refuses_bad_arguments(server) -> None:
    run = subprocess.run([sys.executable, "-m", "matmul_client.bench", "--target", server.target,
                          "--shape", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "positive" in run.stderr
    run = subprocess.run([sys.executable, "-m", "matmul_client.bench", "--target", server.target,
                          "--aio", "--streamed"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--aio" in run.stderr
    run = subprocess.run([sys.executable, "-m", "matmul_client.bench", "--target", server.target,
                          "--stripes", "2"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--stripes applies only with --streamed" in run.stderr
