"""Spread by default (issue 58 item 1): matmul-bench (the C++ client library
at its default settings) and matmul-cli, with one target naming three
host-engine servers on loopback, send each server a fair share of the
multiplies, counted on each server's /metrics, never from timing; and
matmul-cli's calls naming a stored tensor's handle reach the server holding
it (issue 58 item 2).

Run with /usr/bin/python3 (it has NumPy):

    MATMUL_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/client/spread_e2e_test.py

MATMUL_BIN_DIR names the directory holding matmul-server, matmul-cli and
matmul-bench (CTest sets it); it defaults to <repo>/build/bin. The Python
client's share is tests/python/test_spread.py's.
"""

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN_DIR = pathlib.Path(os.environ.get("MATMUL_BIN_DIR", REPO / "build" / "bin"))
SERVER = BIN_DIR / "matmul-server"
CLI = BIN_DIR / "matmul-cli"
BENCH = BIN_DIR / "matmul-bench"

SERVERS = 3
# Each server's share of the multiplies, as issue 58 asks: even would be
# 1/3; round_robin is exact per channel, so only the calls a channel makes
# before its last connection is ready can tilt it.
MIN_SHARE, MAX_SHARE = 0.25, 0.42
# The bench's multiplies per point: the number.
BENCH_REQUESTS = 3000
# matmul-cli runs: one process, one multiply each. Each process's first
# call goes to the connection that is up first, which the library's
# shuffle of an ipv4: list makes a random one: with 600 runs a share
# outside 25%..42% is 4.3 standard deviations out (about 1e-5 a run),
# where a few dozen would fail often. Four at a time: about 30 s.
CLI_RUNS = 600
CLI_PARALLEL = 4


def ok_requests_pattern(method):
    return re.compile(
        r'^matmul_requests_total\{(?=[^}]*method="%s")(?=[^}]*code="OK")[^}]*\}\s+(\S+)'
        % method, re.MULTILINE)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A matmul-server child process on 127.0.0.1, with /metrics."""

    def __init__(self):
        # The metrics port is picked here and released before the server
        # binds it; another process may take it in between: retry.
        for _ in range(5):
            self.log = []
            self.port = None
            self._ready = threading.Event()
            self.proc = subprocess.Popen(
                [str(SERVER), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(free_port()), "--engine", "host"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True)
            self.metrics_port = None
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
            if self._ready.wait(timeout=60) and self.port is not None:
                return
            self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=5)
            if "cannot serve metrics" not in "".join(self.log):
                break
        raise RuntimeError("matmul-server did not start:\n" + "".join(self.log))

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            metrics = re.search(r"metrics on port (\d+)", line)
            if metrics and self.metrics_port is None:
                self.metrics_port = int(metrics.group(1))
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # exited

    def ok_multiplies(self, method="Multiply"):
        """matmul_requests_total{method="Multiply",code="OK"} on /metrics
        (or another method's)."""
        assert self.metrics_port is not None, "".join(self.log)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        with direct.open(url, timeout=10) as reply:
            text = reply.read().decode()
        return sum(int(float(v))
                   for v in ok_requests_pattern(method).findall(text))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._reader.join(timeout=5)


@pytest.fixture(scope="module")
def servers():
    for tool in (SERVER, CLI, BENCH):
        assert tool.exists(), "%s is not built" % tool
    started = []
    try:
        for _ in range(SERVERS):
            started.append(Server())
        yield started
    finally:
        codes = [s.stop() for s in started]
    assert codes == [0] * len(started), "".join(
        "".join(s.log) for s in started)


def spread_target(servers):
    """One target naming every server: ipv4:127.0.0.1:A,127.0.0.1:B,..."""
    return "ipv4:" + ",".join("127.0.0.1:%d" % s.port for s in servers)


class Counts:
    """Each server's OK multiplies since construction."""

    def __init__(self, servers, method="Multiply"):
        self.servers = servers
        self.method = method
        self.before = [s.ok_multiplies(method) for s in servers]

    def since(self, expected=0):
        """Each server's count since construction, once they add up to
        `expected`: a server counts a call when it is done with it, which
        can be just after the client has its answer (bounded: 20 s)."""
        deadline = time.monotonic() + 20
        while True:
            got = [s.ok_multiplies(self.method) - b
                   for s, b in zip(self.servers, self.before)]
            if sum(got) >= expected or time.monotonic() > deadline:
                return got
            time.sleep(0.05)


def assert_spread(counts, total):
    assert sum(counts) == total, counts
    for count in counts:
        assert MIN_SHARE * total <= count <= MAX_SHARE * total, (
            "per-server multiplies %s of %d: each should take %d%% to %d%%" %
            (counts, total, MIN_SHARE * 100, MAX_SHARE * 100))


@pytest.mark.parametrize("concurrency", [1, 8])
def test_bench_spreads_by_default(servers, tmp_path, concurrency):
    """matmul-bench at default flags: its one ClientOptions-default client
    per point (min(concurrency, 16) channels, each round_robin)."""
    counts = Counts(servers)
    report = tmp_path / "bench.json"
    r = subprocess.run(
        [str(BENCH), "--target", spread_target(servers), "--shape", "8",
         "--concurrency", str(concurrency), "--requests", str(BENCH_REQUESTS),
         "--warmup", "0", "--json", str(report)],
        capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(report.read_text())
    assert doc["config"]["lb_policy"] == "round_robin"
    (point,) = doc["points"]
    assert point["errors"] == 0 and point["ok"] == BENCH_REQUESTS, point
    got = counts.since(BENCH_REQUESTS)
    assert sum(got) >= BENCH_REQUESTS, got
    assert_spread(got, sum(got))


def test_bench_pick_first_stays_on_one(servers):
    counts = Counts(servers)
    r = subprocess.run(
        [str(BENCH), "--target", spread_target(servers), "--shape", "8",
         "--concurrency", "4", "--channels", "1", "--requests", "100",
         "--warmup", "0", "--lb-policy", "pick_first"],
        capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    got = counts.since(100)
    assert sorted(got)[:2] == [0, 0] and sum(got) >= 100, got


def test_bench_refuses_an_unknown_policy():
    r = subprocess.run([str(BENCH), "--target", "127.0.0.1:1", "--lb-policy",
                        "grpclb"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--lb-policy takes round_robin or pick_first" in r.stderr


def test_cli_spreads_by_default(servers, tmp_path):
    """matmul-cli: one multiply per process; many such processes spread."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    target = spread_target(servers)

    def run(i):
        out = tmp_path / ("c%d.npy" % i)
        r = subprocess.run(
            [str(CLI), "multiply", "--target", target,
             "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"),
             "--out", str(out)],
            capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        np.testing.assert_array_equal(np.load(out), a @ b)
        out.unlink()

    counts = Counts(servers)
    with concurrent.futures.ThreadPoolExecutor(CLI_PARALLEL) as pool:
        for done in pool.map(run, range(CLI_RUNS)):
            assert done is None
    assert_spread(counts.since(CLI_RUNS), CLI_RUNS)


def test_cli_pick_first_stays_on_one(servers, tmp_path):
    np.save(tmp_path / "a.npy", np.eye(2, dtype=np.float32))
    counts = Counts(servers)
    for _ in range(6):
        r = subprocess.run(
            [str(CLI), "multiply", "--target", spread_target(servers),
             "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "a.npy"),
             "--out", str(tmp_path / "c.npy"), "--lb-policy", "pick_first"],
            capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    assert counts.since(6) == [6, 0, 0]


def test_cli_striped_multiply_stays_on_one_server(servers, tmp_path):
    """A striped streamed multiply's calls must all reach one server (the
    joins find their start there): under round_robin the client sends them
    where a call over the spread went, and successive ones still spread."""
    a = np.arange(48 * 40, dtype=np.float32).reshape(48, 40)
    b = np.arange(40 * 24, dtype=np.float32).reshape(40, 24)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    counts = Counts(servers, "MultiplyStream")
    runs = 12
    for _ in range(runs):
        r = subprocess.run(
            [str(CLI), "multiply", "--target", spread_target(servers),
             "--a", str(tmp_path / "a.npy"), "--b", str(tmp_path / "b.npy"),
             "--out", str(tmp_path / "c.npy"), "--stream", "--stripes", "4",
             "--timeout", "60"],
            capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), a @ b)
    got = counts.since(runs)
    # One multiply per run, counted once (on its start's server).
    assert sum(got) == runs, got
    assert sum(1 for n in got if n > 0) >= 2, got


def test_bench_loses_no_call_to_a_draining_server(tmp_path):
    """Issue 58 item 3: matmul-bench (the C++ library's defaults) over
    three servers of its own; one is sent SIGTERM once it has answered 200
    multiplies. What it refuses while it drains (UNAVAILABLE) the library
    retries on the others: the bench counts no error, and the server exits
    0."""
    started = []
    try:
        for _ in range(SERVERS):
            started.append(Server())
        report = tmp_path / "bench.json"
        bench = subprocess.Popen(
            [str(BENCH), "--target", spread_target(started), "--shape", "8",
             "--concurrency", "8", "--requests", str(BENCH_REQUESTS),
             "--warmup", "0", "--json", str(report)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while (started[0].ok_multiplies() < 200 and bench.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.01)
        assert bench.poll() is None, "the bench ended before the SIGTERM"
        started[0].proc.send_signal(signal.SIGTERM)
        out, _ = bench.communicate(timeout=240)
        assert bench.returncode == 0, out
        (point,) = json.loads(report.read_text())["points"]
        assert point["errors"] == 0 and point["ok"] == BENCH_REQUESTS, (
            {k: v for k, v in point.items() if "error" in k or k == "ok"}, out[-3000:])
        assert started[0].proc.wait(timeout=60) == 0, "".join(started[0].log)
        assert "draining" in "".join(started[0].log)
    finally:
        codes = [s.stop() for s in started[1:]]
        if started and started[0].proc.poll() is None:
            started[0].stop()
    assert codes == [0] * (len(started) - 1), "".join(
        "".join(s.log) for s in started)


def test_cli_handles_find_their_server(servers, tmp_path):
    """Issue 58 item 2 through matmul-cli (the C++ library at its defaults):
    tensors uploaded through the spread target, one process each, land on
    more than one server, and multiplies, downloads and deletes naming
    their handles, through the same target, each reach the server holding
    the handle: no NOT_FOUND, every product exact. (The library's own test,
    30 tensors x 10 multiplies, is handle_routing_test.)"""
    target = spread_target(servers)
    ports = {"127.0.0.1:%d" % s.port for s in servers}
    b = (np.arange(15, dtype=np.float64).reshape(5, 3) * 5) % 7 - 3
    np.save(tmp_path / "b.npy", b)
    stored = []
    for i in range(12):
        a = (np.arange(30, dtype=np.float64).reshape(6, 5) * 3 + i * 7) % 11 - 5
        np.save(tmp_path / "a.npy", a)
        r = subprocess.run([str(CLI), "upload", "--target", target, "--a",
                            str(tmp_path / "a.npy")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        handle = r.stdout.split()[0]
        m = re.match(r"^h1\.(.+)\.-?\d+\.[0-9a-f]{32}$", handle)
        assert m and m.group(1) in ports, handle
        stored.append((handle, m.group(1), a))
    assert len({home for _, home, _ in stored}) >= 2, stored
    out = tmp_path / "c.npy"
    for handle, _, a in stored:
        for _ in range(2):
            r = subprocess.run([str(CLI), "multiply", "--target", target,
                                "--a-handle", handle, "--b",
                                str(tmp_path / "b.npy"), "--out", str(out)],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            np.testing.assert_array_equal(np.load(out), a @ b)
        r = subprocess.run([str(CLI), "delete", "--target", target,
                            "--handle", handle],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_cli_upload_near_a_handle(servers, tmp_path):
    """matmul-cli upload --near ID stores beside that tensor: through the
    spread target, both operands of a multiply by handles on one server,
    and the product exact."""
    target = spread_target(servers)
    b = (np.arange(15, dtype=np.float64).reshape(5, 3) * 5) % 7 - 3
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"

    def upload(path, *extra):
        r = subprocess.run([str(CLI), "upload", "--target", target, "--a", str(path), *extra],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout.split()[0]

    for i in range(6):
        a = (np.arange(30, dtype=np.float64).reshape(6, 5) * 3 + i * 7) % 11 - 5
        np.save(tmp_path / "a.npy", a)
        a_handle = upload(tmp_path / "a.npy")
        b_handle = upload(tmp_path / "b.npy", "--near", a_handle)
        home = re.compile(r"^h1\.(.+)\.-?\d+\.[0-9a-f]{32}$")
        assert home.match(b_handle).group(1) == home.match(a_handle).group(1), (a_handle, b_handle)
        r = subprocess.run([str(CLI), "multiply", "--target", target, "--a-handle", a_handle,
                            "--b-handle", b_handle, "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        np.testing.assert_array_equal(np.load(out), a @ b)
