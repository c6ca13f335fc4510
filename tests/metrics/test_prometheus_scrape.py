"""A real Prometheus scrapes a real matmul-server while multiplies run.

Debian's /usr/bin/prometheus listens on a free loopback port with a
temporary TSDB, scrapes the server's metrics port every second and evaluates
the rules of deploy/prometheus/ (with namespace and pod set on the target,
as the ServiceMonitor does in a cluster). The test sends products for a few
seconds and asserts through Prometheus' HTTP API (/api/v1/query) that
rate(matmul_requests_total[...]) and increase(matmul_stream_busy_seconds_total[...])
moved, and that the recording rules produced series. Everything is bounded:
about 10 s when things go well, 35 s at most.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

import matmul_client

from metrics_helpers import REPO_ROOT, free_port, http_get

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RULES = REPO_ROOT / "deploy" / "prometheus" / "matmul-rules.yml"
DEADLINE_S = 35


class Prometheus:
    """A Prometheus server on 127.0.0.1 scraping `target` every second."""

    def __init__(self, target: str, workdir: Path) -> None:
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files: [{json.dumps(str(RULES))}]\n"
            "scrape_configs:\n"
            "  - job_name: matmul\n"
            "    static_configs:\n"
            f"      - targets: [{json.dumps(target)}]\n"
            "        labels: {namespace: matmul-test, pod: matmul-test-0}\n")
        self.log = workdir / "prometheus.log"
        for _ in range(3):
            self.port = free_port()
            with open(self.log, "w") as log:
                self.process = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={config}",
                     f"--storage.tsdb.path={workdir / 'data'}",
                     f"--web.listen-address=127.0.0.1:{self.port}",
                     "--log.level=warn"],
                    cwd=workdir, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(15):
                return
            self.stop()
        raise RuntimeError(f"prometheus did not become ready:\n{self.log.read_text()}")

    def _wait_ready(self, timeout_s: float) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                return False
            try:
                if http_get(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        status, _, body = http_get(url, timeout=5)
        reply = json.loads(body)
        assert status == 200 and reply["status"] == "success", body
        return reply["data"]

    def value(self, expr: str):
        """The scalar value of a one-series instant query, or None."""
        result = self.api("query", query=expr)["result"]
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="needs Debian's prometheus")
def test_prometheus_sees_requests_and_stream_busy_time(server):
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="matmul-prometheus-"))
    stop = threading.Event()
    sent = {"ok": 0, "errors": 0}

    def load() -> None:
        # Small enough for the host engine to answer in milliseconds, big
        # enough that the busy counters move between scrapes.
        a = np.ones((192, 192), np.float32)
        with matmul_client.Client(server.target, timeout=10) as client:
            end = time.monotonic() + 20  # stops by itself in any case
            while not stop.is_set() and time.monotonic() < end:
                try:
                    client.multiply(a, a)
                    sent["ok"] += 1
                except matmul_client.MatmulError:
                    sent["errors"] += 1
                time.sleep(0.005)

    prometheus = Prometheus(f"127.0.0.1:{server.metrics_port}", workdir)
    senders = [threading.Thread(target=load, daemon=True) for _ in range(2)]
    try:
        for t in senders:
            t.start()
        checks = {
            "requests": 'sum(rate(matmul_requests_total{job="matmul",method="Multiply",code="OK"}[10s]))',
            "stream busy": 'sum(increase(matmul_stream_busy_seconds_total{job="matmul",device="host"}[10s]))',
            "device busy": 'sum(rate(matmul_device_busy_seconds_total{job="matmul"}[10s]))',
            "recorded utilization": 'pod:matmul_stream_utilization:avg_rate1m{pod="matmul-test-0"}',
            "recorded request rate": 'sum(namespace_method_code:matmul_requests:rate5m{code="OK"})',
        }
        values = {}
        while time.monotonic() - started < DEADLINE_S:
            values = {name: prometheus.value(expr) for name, expr in checks.items()}
            if all(v is not None and v > 0 for v in values.values()):
                break
            time.sleep(0.5)
        up = prometheus.value('up{job="matmul"}')
        assert up == 1, f"target not up: {prometheus.api('targets')}"
        for name, value in values.items():
            assert value is not None and value > 0, (
                f"{name}: {checks[name]} = {value} after {time.monotonic() - started:.1f} s; "
                f"sent {sent}; all: {values}")
        # Every rule of deploy/prometheus/ loaded and evaluates without error.
        groups = prometheus.api("rules")["groups"]
        assert {g["name"] for g in groups} >= {"matmul.rules", "matmul.alerts"}
        for group in groups:
            for rule in group["rules"]:
                assert rule["health"] == "ok", f"rule {rule['name']}: {rule.get('lastError')}"
    finally:
        stop.set()
        for t in senders:
            t.join(15)
        prometheus.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    assert sent["ok"] > 0
    assert time.monotonic() - started < 40
