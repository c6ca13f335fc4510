"""End-to-end tests of `matmul-cli multiply --shared-memory` and
`matmul-bench --shared-memory` against a real matmul-server (host engine)
listening on a Unix socket in a fresh folder (and on loopback TCP, where
shared memory is refused).

    MATMUL_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q tests/client/shared_memory_e2e_test.py

MATMUL_BIN_DIR names the directory holding matmul-server, matmul-cli and
matmul-bench (CTest sets it); it defaults to <repo>/build/bin.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
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
REGIONS_GAUGE = "matmul_shared_memory_regions"
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-2}


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A matmul-server child on 127.0.0.1 and on a Unix socket."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="matmul-shm-e2e-", dir="/tmp")
        self.socket = os.path.join(self.folder, "matmul.sock")
        # The metrics port is picked here (--metrics-port 0 disables the
        # endpoint) and released before the server binds it: another
        # process may take it in between, so retry with another one.
        for _ in range(5):
            self.metrics_port = free_port()
            self.proc = subprocess.Popen(
                [str(SERVER), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(self.metrics_port), "--engine", "host",
                 "--unix_socket", self.socket],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, text=True)
            self.log = []
            self.port = None
            self._ready = threading.Event()
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
            if self._ready.wait(timeout=60) and self.port is not None:
                break
            self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=5)
            if "cannot serve metrics" not in "".join(self.log):
                break  # not a metrics port clash: another try would not help
            if os.path.exists(self.socket):
                os.unlink(self.socket)
        if self.port is None:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise RuntimeError("matmul-server did not start:\n" + "".join(self.log))
        self.tcp = "127.0.0.1:%d" % self.port
        self.unix = "unix:" + self.socket

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()

    def gauge(self, name):
        url = "http://127.0.0.1:%d/metrics" % self.metrics_port
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(url, timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError("%s is not on /metrics" % name)

    def wait_for_gauge(self, name, value, timeout=30):
        deadline = time.monotonic() + timeout
        while self.gauge(name) != value:
            assert time.monotonic() < deadline, "%s stayed at %s, not %s" % (
                name, self.gauge(name), value)
            time.sleep(0.05)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._reader.join(timeout=5)
            shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    for binary in (SERVER, CLI, BENCH):
        assert binary.exists(), "%s is not built" % binary
    s = Server()
    yield s
    rc = s.stop()
    assert rc == 0, "matmul-server exited %d on SIGTERM:\n%s" % (rc, "".join(s.log))


def run(binary, *args, timeout=120):
    return subprocess.run([str(binary)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout)


def run_with_pid(binary, *args, timeout=120):
    """(CompletedProcess, pid) of a child run to its end."""
    with subprocess.Popen([str(binary)] + [str(a) for a in args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), proc.pid


def objects_of(pid):
    """The shared-memory objects in /dev/shm that process ``pid`` made: the
    C++ client names them "/matmul-<pid>-<n>" (client/lib/shared_memory_object.cc).
    Other tests that ctest runs alongside make their own matmul-* objects,
    so only the pid tells ours apart."""
    prefix = "matmul-%d-" % pid
    return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}


def relative_error(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    norm = np.linalg.norm(want)
    return np.linalg.norm(got - want) / (norm if norm > 0 else 1.0)


@pytest.mark.parametrize("dtype,shape_a,shape_b,flags", [
    ("float32", (33, 17), (17, 9), []),
    ("float64", (17, 33), (9, 17), ["--transpose-a", "--transpose-b"]),
    ("float16", (8, 16), (16, 4), []),
    ("float32", (3, 5, 7), (7, 4), []),
])
def test_cli_multiply_through_shared_memory(server, tmp_path, dtype, shape_a, shape_b, flags):
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, shape_a).astype(dtype)
    b = rng.uniform(-1, 1, shape_b).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "c.npy"
    before = set(os.listdir("/dev/shm"))
    r, pid = run_with_pid(CLI, "multiply", "--target", server.unix,
                          "--a", tmp_path / "a.npy", "--b", tmp_path / "b.npy",
                          "--out", out, "--client-id", "shm-cli",
                          "--shared-memory", *flags)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "shared-memory region" in r.stdout, r.stdout
    c = np.load(out)
    x = np.swapaxes(a, -1, -2) if "--transpose-a" in flags else a
    y = np.swapaxes(b, -1, -2) if "--transpose-b" in flags else b
    want = x.astype(np.float64) @ y.astype(np.float64)
    assert c.shape == want.shape and c.dtype == np.dtype(dtype)
    assert relative_error(c, want) < TOLERANCE[dtype]
    # The CLI left nothing in /dev/shm (a name of its pid that was there
    # before it started belongs to an earlier process of that pid).
    assert not objects_of(pid) - before, objects_of(pid)
    server.wait_for_gauge(REGIONS_GAUGE, 0)


def test_cli_shared_memory_refused_over_tcp(server, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    r = run(CLI, "multiply", "--target", server.tcp, "--a", tmp_path / "a.npy",
            "--b", tmp_path / "a.npy", "--out", tmp_path / "c.npy", "--shared-memory")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("error: PERMISSION_DENIED"), r.stderr
    assert not (tmp_path / "c.npy").exists()


@pytest.mark.parametrize("extra", [["--stream"], ["--keep"], ["--a-handle", "h-1"]])
def test_cli_shared_memory_usage_errors(server, tmp_path, extra):
    np.save(tmp_path / "a.npy", np.ones((2, 2), np.float32))
    args = ["multiply", "--target", server.unix, "--b", tmp_path / "a.npy",
            "--shared-memory"] + extra
    if "--a-handle" not in extra:
        args += ["--a", tmp_path / "a.npy"]
    if "--keep" not in extra:
        args += ["--out", tmp_path / "c.npy"]
    r = run(CLI, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--shared-memory" in r.stderr, r.stderr


def test_bench_through_shared_memory_verified(server, tmp_path):
    out = tmp_path / "bench.json"
    r = run(BENCH, "--target", server.unix, "--shared-memory", "--shape", "40x24x32",
            "--concurrency", "1,4", "--duration", "1", "--warmup", "0.2",
            "--verify-every", "1", "--client-id", "shm-bench", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "through shared memory" in r.stdout, r.stdout
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["config"]["shared_memory"] is True
    points = doc["points"]
    assert [p["concurrency"] for p in points] == [1, 4]
    for p in points:
        assert p["shared_memory"] is True
        assert p["ok"] > 0 and p["errors"] == 0, p["error_messages"]
        # Every response was read back from its region and checked.
        assert p["verify"]["checked"] == p["ok"] > 0
        assert p["verify"]["mismatches"] == 0
        assert p["request_bytes"] == 0 and p["response_bytes"] == 0
        # References into the region, not data: a few dozen bytes each way.
        assert 0 < p["request_message_bytes"] < 200
        assert 0 < p["response_message_bytes"] < 200
        assert p["tflop_per_s"] > 0
    # The bench's sessions ended with it.
    server.wait_for_gauge(REGIONS_GAUGE, 0)


def test_bench_shared_memory_refused_over_tcp(server):
    r = run(BENCH, "--target", server.tcp, "--shared-memory", "--shape", "16",
            "--concurrency", "1", "--requests", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PERMISSION_DENIED" in r.stderr, r.stderr


def test_bench_shared_memory_excludes_resident(server):
    r = run(BENCH, "--target", server.unix, "--shared-memory", "--resident")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--shared-memory and --resident" in r.stderr, r.stderr
