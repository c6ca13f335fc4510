"""End-to-end tests of matmul-bench and bench/plot/plot_bench.py against a
real matmul-server (host engine).

Run with /usr/bin/python3 (it has matplotlib; the python3 first on PATH may
not):

    MATMUL_BIN_DIR=build/bin /usr/bin/python3 -m pytest -q bench/tests/bench_e2e_test.py

MATMUL_BIN_DIR names the directory holding matmul-server and matmul-bench
(CTest sets it); it defaults to <repo>/build/bin. MATMUL_REPO_DIR names the
repository (for bench/plot/plot_bench.py); it defaults to this file's.
"""

import importlib.util
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

HERE = pathlib.Path(__file__).resolve()
REPO = pathlib.Path(os.environ.get("MATMUL_REPO_DIR", HERE.parents[2]))
BIN_DIR = pathlib.Path(os.environ.get("MATMUL_BIN_DIR", REPO / "build" / "bin"))
SERVER = BIN_DIR / "matmul-server"
BENCH = BIN_DIR / "matmul-bench"
CLI = BIN_DIR / "matmul-cli"
PLOT = REPO / "bench" / "plot" / "plot_bench.py"

POINT_FIELDS = [
    "label", "timestamp", "host", "target", "shape", "batch", "m", "k", "n",
    "dtype", "compute", "mode", "concurrency", "channels", "rate",
    "duration_s", "requests_target", "warmup_s", "timeout_s", "elapsed_s",
    "requests", "ok", "errors", "errors_by_code", "requests_per_s",
    "request_bytes", "response_bytes", "request_gb_per_s",
    "response_gb_per_s", "total_gb_per_s", "flops_per_request",
    "tflop_per_s", "latency_ms", "verify", "interrupted", "server",
    "blocking_calls",
]


# The servers running now, for what a timed-out bench leaves to read.
_LIVE_SERVERS = []

# Metrics that tell a request lost in the server from a slow or stuck
# client: what the server holds in flight and has queued, and what it
# answered.
_DIAGNOSTIC_METRICS = ("matmul_inflight_requests", "matmul_inflight_bytes",
                       "matmul_oldest_request_seconds",
                       "matmul_queued_requests", "matmul_requests_total",
                       "matmul_rejected_requests_total")


class Server:
    """A matmul-server child process on a free loopback port."""

    def __init__(self, *extra, metrics=False):
        """``metrics``: serve /metrics on a free loopback port."""
        _LIVE_SERVERS.append(self)
        # The metrics port is picked here (--metrics-port 0 disables the
        # endpoint) and released before the server binds it: another
        # process may take it in between, so retry with another one.
        for _ in range(5 if metrics else 1):
            self.proc = subprocess.Popen(
                [str(SERVER), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(free_port() if metrics else 0),
                 "--engine", "host"]
                + list(extra),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            self.log = []
            self.port = None
            self.metrics_port = None
            self._ready = threading.Event()
            # Drain stderr for the whole life of the process so that it
            # never blocks on a full pipe.
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
            if self._ready.wait(timeout=60) and self.port is not None:
                break
            self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=5)
            if "cannot serve metrics" not in "".join(self.log):
                break  # not a metrics port clash: another try would not help
        if self.port is None:
            _LIVE_SERVERS.remove(self)
            raise RuntimeError("matmul-server did not report 'serving on "
                               "port N':\n" + "".join(self.log))
        self.target = "127.0.0.1:%d" % self.port

    def _read(self):
        for line in self.proc.stderr:
            self.log.append(line)
            metrics = re.search(r"metrics on port (\d+)", line)
            if metrics:
                self.metrics_port = int(metrics.group(1))
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # exited without serving

    def stop(self):
        if self in _LIVE_SERVERS:
            _LIVE_SERVERS.remove(self)
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
def server():
    assert SERVER.exists(), "%s is not built" % SERVER
    assert BENCH.exists(), "%s is not built" % BENCH
    s = Server(metrics=True)
    yield s
    assert s.stop() == 0, "".join(s.log)


def server_diagnostics():
    """Each running server's log tail and in-flight metrics, as text."""
    parts = []
    for s in list(_LIVE_SERVERS):
        parts.append("server %s, log tail:\n%s" % (
            getattr(s, "target", "?"), "".join(s.log[-30:])))
        if s.metrics_port is None:
            continue
        url = "http://127.0.0.1:%d/metrics" % s.metrics_port
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode("utf-8", "replace")
        except OSError as e:
            parts.append("scrape of %s failed: %s" % (url, e))
            continue
        parts.append("\n".join(
            l for l in text.splitlines()
            if l.startswith(_DIAGNOSTIC_METRICS) and not l.endswith(" 0")))
    return "\n".join(parts)


def bench(*args, timeout=60):
    try:
        return subprocess.run([str(BENCH)] + [str(a) for a in args],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        # What the bench printed, and what the servers hold: a request lost
        # in the server shows as one in flight there.
        def text(b):
            return b.decode("utf-8", "replace") if isinstance(b, bytes) else (b or "")
        pytest.fail("matmul-bench %s timed out after %s s\nstdout:\n%s\n"
                    "stderr:\n%s\n%s" % (" ".join(str(a) for a in args),
                                          timeout, text(e.stdout),
                                          text(e.stderr), server_diagnostics()))


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["schema"] == "matmul-bench/1"
    return doc


def check_point_sane(p):
    for field in POINT_FIELDS:
        assert field in p, "point lacks %r: %s" % (field, p)
    lat = p["latency_ms"]
    assert p["requests"] > 0
    assert p["ok"] > 0
    assert p["requests_per_s"] > 0
    assert p["elapsed_s"] > 0
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] \
        <= lat["p99_9"] <= lat["max"]
    assert lat["count"] == p["ok"]
    assert p["total_gb_per_s"] == pytest.approx(
        p["request_gb_per_s"] + p["response_gb_per_s"])
    assert p["request_gb_per_s"] == pytest.approx(
        p["requests_per_s"] * p["request_bytes"] / 1e9)
    assert p["tflop_per_s"] == pytest.approx(
        p["requests_per_s"] * p["flops_per_request"] / 1e12)
    assert p["server"]["engine"] == "host"
    assert len(p["server"]["device_names"]) == 1
    assert p["server"]["streams_per_device"] > 0
    assert not p["interrupted"]


def test_sweep_with_verify(server, tmp_path):
    out = tmp_path / "out.json"
    r = bench("--target", server.target, "--shape", "48x40x24",
              "--concurrency", "1,4", "--duration", "1", "--warmup", "0.2",
              "--verify", "--verify-every", "8", "--json", out,
              "--label", "e2e sweep")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = load(out)
    assert doc["target"] == server.target
    assert doc["config"]["shape"] == "48x40x24"
    assert doc["config"]["verify"] is True
    points = doc["points"]
    assert [p["concurrency"] for p in points] == [1, 4]
    assert [p["channels"] for p in points] == [1, 4]
    for p in points:
        check_point_sane(p)
        assert p["label"] == "e2e sweep"
        assert p["mode"] == "closed"
        assert p["rate"] is None
        assert p["duration_s"] == 1
        assert (p["m"], p["k"], p["n"], p["batch"]) == (48, 40, 24, 0)
        assert p["dtype"] == "float32" and p["compute"] == "strict"
        assert p["errors"] == 0
        assert p["errors_by_code"] == {}
        assert "WRONG_ANSWER" not in p["errors_by_code"]
        assert p["verify"]["enabled"] and p["verify"]["checked"] > 0
        assert p["verify"]["mismatches"] == 0
        assert p["request_bytes"] == (48 * 40 + 40 * 24) * 4
        assert p["response_bytes"] == 48 * 24 * 4
        assert p["flops_per_request"] == 2 * 48 * 40 * 24
        # Throughput counts a 1 s window; nothing absurd.
        assert 0.9 < p["elapsed_s"] < 1.5
        assert p["blocking_calls"] is False  # callbacks, by default
    # The table on stdout: a header and one row per point.
    lines = r.stdout.splitlines()
    header = [i for i, l in enumerate(lines) if "req/s" in l and "p99.9" in l]
    assert len(header) == 1
    rows = lines[header[0] + 1:]
    assert [int(l.split()[0]) for l in rows] == [1, 4]


@pytest.mark.parametrize("dtype,shape", [("bfloat16", "2x16x64x8"),
                                         ("float64", "33x17x5"),
                                         ("float16", "20")])
def test_dtypes_and_batches_verify(server, tmp_path, dtype, shape):
    out = tmp_path / "out.json"
    r = bench("--target", server.target, "--shape", shape, "--dtype", dtype,
              "--concurrency", "2", "--requests", "30", "--warmup", "0",
              "--verify-every", "1", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_point_sane(p)
    assert p["requests"] == 30 and p["ok"] == 30
    assert p["verify"]["checked"] == 30 and p["verify"]["mismatches"] == 0
    assert p["requests_target"] == 30 and p["duration_s"] is None


def test_blocking_calls_sweep_with_verify(server, tmp_path):
    # A thread per request in flight, each making blocking calls: by
    # duration, then by count (every request counted starts, whichever
    # thread counted it).
    out = tmp_path / "blocking.json"
    r = bench("--target", server.target, "--shape", "48x40x24",
              "--concurrency", "1,4", "--duration", "1", "--warmup", "0.2",
              "--verify", "--verify-every", "8", "--blocking-calls",
              "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "blocking calls (a thread per request in flight)" in r.stdout
    doc = load(out)
    assert doc["config"]["blocking_calls"] is True
    assert [p["concurrency"] for p in doc["points"]] == [1, 4]
    for p in doc["points"]:
        check_point_sane(p)
        assert p["blocking_calls"] is True and p["mode"] == "closed"
        assert p["errors"] == 0, p["error_messages"]
        assert p["verify"]["checked"] > 0 and p["verify"]["mismatches"] == 0
        assert 0.9 < p["elapsed_s"] < 1.5
    for attempt in range(5):
        out = tmp_path / ("count%d.json" % attempt)
        r = bench("--target", server.target, "--shape", "8",
                  "--concurrency", "8", "--requests", "200", "--warmup", "0",
                  "--verify-every", "1", "--blocking-calls", "--json", out,
                  timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
        (p,) = load(out)["points"]
        assert p["requests"] == 200 and p["ok"] == 200, p
        assert p["verify"]["checked"] == 200 and p["abandoned"] == 0


def test_blocking_calls_with_kept_products(server, tmp_path):
    # A sampled kept product holds its slot while it is downloaded and
    # checked: the caller's next call waits for it.
    out = tmp_path / "blocking_resident.json"
    r = bench("--target", server.target, "--shape", "20",
              "--concurrency", "3", "--requests", "60", "--warmup", "0",
              "--resident", "--verify-every", "1", "--blocking-calls",
              "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_resident_point(p, "all")
    assert p["blocking_calls"] is True
    assert p["requests"] == 60 and p["ok"] == 60
    assert p["verify"]["checked"] == 60 and p["verify"]["mismatches"] == 0
    assert p["deletes"]["issued"] == 60
    assert_nothing_stored(server, p["resident_operands"])


@pytest.mark.parametrize("args,message", [
    (["--blocking-calls", "--rate", "10"], "not with --rate"),
    (["--blocking-calls", "--concurrency", "4,257"],
     "--concurrency is at most 256 with it, got 257"),
    (["--stream", "--blocking-calls"], "not with --blocking-calls"),
])
def test_blocking_calls_refuses_what_does_not_apply(server, args, message):
    r = bench("--target", server.target, "--shape", "8", *args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stderr.startswith("matmul-bench: "), r.stderr
    assert message in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_fixed_rate(server, tmp_path):
    out = tmp_path / "rate.json"
    r = bench("--target", server.target, "--shape", "32",
              "--rate", "50", "--requests", "40", "--concurrency", "8",
              "--warmup", "0", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_point_sane(p)
    assert p["mode"] == "open"
    assert p["rate"] == 50
    assert p["concurrency"] == 8
    assert p["requests"] == 40 and p["errors"] == 0
    # 40 starts 20 ms apart: the last one at 0.78 s.
    assert 0.7 < p["elapsed_s"] < 2.0
    assert 20 < p["requests_per_s"] < 60


def test_stable_runs_windows_until_three_agree(server, tmp_path):
    """--stable: windows of --duration until the last three agree within 10%
    (or --stable-windows); the point is the last window, the line and the
    JSON say how it went. A fixed rate makes the windows agree."""
    out = tmp_path / "stable.json"
    r = bench("--target", server.target, "--shape", "16", "--rate", "100",
              "--concurrency", "4", "--duration", "0.5", "--warmup", "0",
              "--stable", "--stable-windows", "6", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_point_sane(p)
    windows = p["stability"]["window_requests_per_s"]
    assert 3 <= len(windows) <= 6
    assert p["requests_per_s"] == pytest.approx(windows[-1], rel=1e-9)
    last = windows[-3:]
    if p["stability"]["stable"]:
        assert max(last) <= 1.10 * min(last)
        assert f"stable after {len(windows)} windows" in r.stdout
    else:
        assert len(windows) == 6 and "NOT stable after 6 windows" in r.stdout
    # Without --stable: one window, no stability entry.
    r = bench("--target", server.target, "--shape", "16", "--requests", "5",
              "--concurrency", "1", "--warmup", "0", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stability" not in load(out)["points"][0]
    # --stable with --requests is a usage error.
    r = bench("--target", server.target, "--stable", "--requests", "5")
    assert r.returncode == 2 and "not with --requests" in r.stderr


def test_errors_counted_by_code(tmp_path):
    small = Server("--max-message-bytes", "4096")
    try:
        out = tmp_path / "errors.json"
        r = bench("--target", small.target, "--shape", "64",
                  "--concurrency", "2", "--duration", "0.5", "--warmup", "0",
                  "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "RESOURCE_EXHAUSTED" in r.stdout
        (p,) = load(out)["points"]
        assert p["ok"] == 0
        assert p["requests_per_s"] == 0
        assert p["errors"] > 0
        assert p["errors_by_code"] == {"RESOURCE_EXHAUSTED": p["errors"]}
        assert p["error_messages"]["RESOURCE_EXHAUSTED"]
    finally:
        assert small.stop() == 0


def test_usage_errors(server):
    for args in (["--shape", "64"],  # no target
                 ["--target", server.target, "--shape", "0"],
                 ["--target", server.target, "--dtype", "int8"],
                 ["--target", server.target, "--concurrency", "0"],
                 ["--target", server.target, "--duration", "1",
                  "--requests", "5"],
                 ["--target", server.target, "--rate", "-3"],
                 ["--target", server.target, "--bogus"]):
        r = bench(*args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        # One line, not the whole help.
        assert r.stderr.startswith("matmul-bench: "), r.stderr
        assert r.stderr.endswith("; see --help\n"), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
    r = bench("--help")
    assert r.returncode == 0 and "--concurrency" in r.stdout


def test_no_server_fails_fast(tmp_path):
    # A port nobody listens on: GetServerInfo fails, exit 1.
    start = time.monotonic()
    r = bench("--target", "127.0.0.1:1", "--timeout", "3", "--duration", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "GetServerInfo" in r.stderr
    assert time.monotonic() - start < 10


def read_to_table_header(proc):
    """Reads the bench's stdout up to its table's header line, which it
    prints (and flushes) just before the first point starts, so that a
    signal sent after it finds a point running however slowly the bench
    got there (a loaded machine). Returns the lines read."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "req/s" in line and "p99.9" in line:
            return seen
    raise AssertionError("no table header: " + "".join(seen))


def test_interrupt_reports_what_it_has(server, tmp_path):
    out = tmp_path / "int.json"
    proc = subprocess.Popen(
        [str(BENCH), "--target", server.target, "--shape", "32",
         "--concurrency", "2,4", "--duration", "30", "--warmup", "0",
         "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = read_to_table_header(proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    stdout = "".join(head) + stdout
    assert proc.returncode == 130, stdout + stderr
    (p,) = load(out)["points"]
    assert p["interrupted"] is True
    assert p["concurrency"] == 2
    assert p["ok"] > 0


def test_plot(server, tmp_path):
    jsons = []
    for shape in ("16", "40"):
        out = tmp_path / ("plot%s.json" % shape)
        r = bench("--target", server.target, "--shape", shape,
                  "--concurrency", "1,2", "--duration", "0.3",
                  "--warmup", "0", "--json", out, "--label", "plot")
        assert r.returncode == 0, r.stdout + r.stderr
        jsons.append(out)
    png_dir = tmp_path / "png"
    r = subprocess.run([sys.executable, str(PLOT)] + [str(j) for j in jsons]
                       + ["--out", str(png_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("throughput.png", "latency.png", "tflops.png"):
        path = png_dir / name
        assert path.exists(), r.stdout + r.stderr
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 10000
    # Not a report: a clean error.
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = subprocess.run([sys.executable, str(PLOT), str(bad), "--out",
                        str(png_dir)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "not a matmul-bench report" in r.stderr


def test_plot_names_streamed_series_apart():
    spec = importlib.util.spec_from_file_location("plot_bench", PLOT)
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    unary = {"shape": "64x64x64", "dtype": "float32", "streamed": False,
             "stream": None}
    one = dict(unary, streamed=True,
               stream={"stripes": 1, "chunk_bytes": 4 << 20})
    three = dict(unary, streamed=True,
                 stream={"stripes": 3, "chunk_bytes": 64 << 10})
    assert plot.series_name(unary) == "64x64x64 float32"
    assert plot.series_name(one) == "64x64x64 float32 streamed (4 MiB chunks)"
    assert (plot.series_name(three)
            == "64x64x64 float32 streamed x3 (64 KiB chunks)")
    # Reports from before --stream have neither field.
    assert plot.series_name({"shape": "8", "dtype": "float64"}) == "8 float64"


# --- resident operands and products (--resident) ---------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stored_gauges(server):
    """{"matmul_stored_bytes": v, "matmul_stored_tensors": v} for the gauges
    the server exports (either may not exist); {} without metrics."""
    if server.metrics_port is None:
        return {}
    url = "http://127.0.0.1:%d/metrics" % server.metrics_port
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for line in text.splitlines():
        m = re.match(r"(matmul_stored_(?:bytes|tensors))(\{[^}]*\})?\s+(\S+)",
                     line)
        if m:
            found[m.group(1)] = found.get(m.group(1), 0) + float(m.group(3))
    return found


def assert_nothing_stored(server, operand_ids):
    """The server holds no stored tensors: its gauges (where it exports
    them) read 0, and the bench's operand handles are gone."""
    for name, value in stored_gauges(server).items():
        assert value == 0, "%s = %s after the run" % (name, value)
    if not CLI.exists():
        return
    for handle in operand_ids:
        r = subprocess.run([str(CLI), "download", "--target", server.target,
                            "--handle", handle, "--out", os.devnull],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 1, (handle, r.stdout, r.stderr)
        assert r.stderr.startswith("error: NOT_FOUND"), r.stderr


def check_resident_point(p, mode):
    check_point_sane(p)
    assert p["resident"] == mode
    assert p["errors"] == 0, p["error_messages"]
    assert p["errors_by_code"] == {}
    assert p["request_bytes"] == 0 and p["request_gb_per_s"] == 0
    assert p["tflop_per_s"] > 0
    # Handles, not data: the request is a few dozen bytes.
    assert 0 < p["request_message_bytes"] < 200
    assert p["wire_gb_per_s"] == pytest.approx(
        p["requests_per_s"]
        * (p["request_message_bytes"] + p["response_message_bytes"]) / 1e9)
    assert p["upload_s"] > 0
    assert p["operand_delete_errors"] == 0
    d = p["deletes"]
    assert d["errors"] == 0 and d["errors_by_code"] == {}, d
    assert d["abandoned"] == 0
    assert d["ok"] == d["issued"]
    if mode == "all":
        assert p["response_bytes"] == 0 and p["response_gb_per_s"] == 0
        assert 0 < p["response_message_bytes"] < 200
        # Every kept product (warm-up included) was deleted.
        assert d["issued"] >= p["ok"] > 0
    else:
        assert p["response_bytes"] == p["m"] * p["n"] * 4 * max(p["batch"], 1) \
            or p["dtype"] != "float32"
        assert p["response_message_bytes"] > p["response_bytes"]
        assert d["issued"] == 0


def test_resident_all_with_verify(tmp_path):
    s = Server(metrics=True)
    try:
        out = tmp_path / "resident.json"
        r = bench("--target", s.target, "--shape", "48x40x24",
                  "--concurrency", "1,4", "--duration", "1", "--warmup", "0.2",
                  "--resident", "--verify", "--verify-every", "4",
                  "--client-id", "e2e-bench", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "products kept and deleted" in r.stdout
        doc = load(out)
        assert doc["config"]["resident"] == "all"
        assert doc["config"]["client_id"] == "e2e-bench"
        assert doc["config"]["verify"] is True
        points = doc["points"]
        assert [p["concurrency"] for p in points] == [1, 4]
        operand_ids = []
        for p in points:
            check_resident_point(p, "all")
            # --verify downloaded sampled kept products and checked them.
            assert p["verify"]["checked"] > 0
            assert p["verify"]["mismatches"] == 0
            assert len(p["resident_operands"]) == 2 * doc["config"]["distinct_requests"]
            operand_ids += p["resident_operands"]
        assert len(set(operand_ids)) == len(operand_ids)  # fresh per point
        assert_nothing_stored(s, operand_ids)
    finally:
        assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize("mode,dtype,shape", [
    ("operands", "float32", "33x17x5"),
    ("all", "bfloat16", "2x16x64x8"),
    ("all", "float64", "20"),
])
def test_resident_by_count_verifies_every_response(server, tmp_path, mode,
                                                   dtype, shape):
    out = tmp_path / "resident.json"
    r = bench("--target", server.target, "--shape", shape, "--dtype", dtype,
              "--concurrency", "3", "--requests", "30", "--warmup", "0",
              "--resident", mode, "--verify-every", "1", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_resident_point(p, mode)
    assert p["requests"] == 30 and p["ok"] == 30
    assert p["verify"]["checked"] == 30 and p["verify"]["mismatches"] == 0
    if mode == "all":
        assert p["deletes"]["issued"] == 30
    assert_nothing_stored(server, p["resident_operands"])


def test_resident_open_loop(server, tmp_path):
    out = tmp_path / "resident_rate.json"
    r = bench("--target", server.target, "--shape", "32", "--rate", "100",
              "--requests", "40", "--concurrency", "4", "--warmup", "0",
              "--resident=all", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_resident_point(p, "all")
    assert p["mode"] == "open" and p["requests"] == 40
    assert_nothing_stored(server, p["resident_operands"])


def test_resident_upload_over_quota_fails_cleanly(tmp_path):
    # Two distinct requests need four stored operands; the server allows 3.
    s = Server("--max-handles-per-client", "3", metrics=True)
    try:
        r = bench("--target", s.target, "--shape", "16", "--distinct", "2",
                  "--concurrency", "1", "--duration", "0.3", "--warmup", "0",
                  "--resident", "--client-id", "quota-e2e")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "RESOURCE_EXHAUSTED" in r.stderr
        assert "quota-e2e" in r.stderr
        # What it had uploaded before the refusal is deleted.
        assert_nothing_stored(s, [])
        # Inline, the same bench runs fine under that quota.
        r = bench("--target", s.target, "--shape", "16", "--distinct", "2",
                  "--concurrency", "1", "--duration", "0.3", "--warmup", "0",
                  "--client-id", "quota-e2e")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_resident_operands_over_the_message_size(tmp_path):
    # The bench's stored operands and kept products are larger than the
    # server's messages: they go up in chunks (UploadStream), the sampled
    # products come back in chunks (DownloadStream) and check out. The same
    # path stores a 1 GiB operand (--shape 16384) at the default limit.
    s = Server("--max-message-bytes", "65536", metrics=True)
    try:
        out = tmp_path / "resident_chunks.json"
        r = bench("--target", s.target, "--shape", "160", "--distinct", "1",
                  "--concurrency", "1", "--requests", "3", "--warmup", "0",
                  "--resident", "--verify-every", "1", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "message limit" not in r.stderr
        (p,) = load(out)["points"]
        check_resident_point(p, "all")
        assert p["ok"] == 3
        assert p["verify"]["checked"] == 3 and p["verify"]["mismatches"] == 0
        assert_nothing_stored(s, p["resident_operands"])
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_resident_usage_errors(server):
    for args in (["--resident=some"], ["--resident", "--resident"],
                 ["--client-id", "caf\u00e9"]):
        r = bench("--target", server.target, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.endswith("; see --help\n"), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
    r = bench("--help")
    assert "--resident" in r.stdout and "--client-id" in r.stdout


# --- shape mix and the server's device time (--shape-mix, --server-metrics) -


def test_shape_mix_with_server_metrics(tmp_path):
    # One lane: while it is busy the mix's shapes gather, and the batching
    # engine sends them out a batch per shape.
    s = Server("--streams-per-device", "1", metrics=True)
    try:
        out = tmp_path / "mix.json"
        r = bench("--target", s.target, "--shape-mix", "16,24x8x40,32",
                  "--concurrency", "16", "--requests", "600", "--warmup", "0",
                  "--verify", "--verify-every", "3", "--distinct", "2",
                  "--server-metrics", "127.0.0.1:%d" % s.metrics_port,
                  "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "shape mix 16x16x16,24x8x40,32x32x32" in r.stdout
        assert "c=16 server:" in r.stdout and " launches (" in r.stdout
        doc = load(out)
        p = doc["points"][0]
        check_point_sane(p)
        assert p["shape_mix"] == ["16x16x16", "24x8x40", "32x32x32"]
        assert doc["config"]["shape_mix"] == p["shape_mix"]
        assert doc["config"]["distinct_requests"] == 6
        assert p["errors"] == 0, p["error_messages"]
        assert p["verify"]["checked"] > 0 and p["verify"]["mismatches"] == 0
        # Means over the mix: (2*16^3 + 2*24*8*40 + 2*32^3) / 3.
        assert p["flops_per_request"] == pytest.approx(
            (2 * 16**3 + 2 * 24 * 8 * 40 + 2 * 32**3) / 3)
        m = p["server_metrics"]
        # The server counted the bench's multiplies (the 600 measured, and
        # any the closed loop started past them).
        assert p["ok"] == 600
        assert m["multiplies_ok"] >= 600 and m["launched_requests"] >= 600
        assert m["compute_busy_s"] > 0 and m["compute_us_per_request"] > 0
        # The launches add up (whether requests met a busy lane and were
        # batched depends on timing here).
        assert 0 < m["jobs_per_request"] <= 1
        assert m["launches"] <= m["launched_requests"]
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_shape_mix_usage_errors(server):
    for args in (["--shape-mix", ""], ["--shape-mix", "64,x"],
                 ["--shape-mix", "64", "--shape", "64"],
                 ["--shape-mix", "64", "--server-metrics", "nohost"],
                 ["--server-metrics", "127.0.0.1:0"]):
        r = bench("--target", server.target, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("matmul-bench: "), r.stderr


def test_server_metrics_unreachable_fails(server):
    r = bench("--target", server.target, "--shape", "8", "--concurrency", "1",
              "--requests", "5", "--warmup", "0",
              "--server-metrics", "127.0.0.1:%d" % free_port())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "server metrics" in r.stderr


# --- streamed multiplies (--stream, --stream-chunk-bytes, --stripes) --------


def stripe_counters(server):
    """{"start": n, "join": n}: matmul_stream_stripes_total by kind, the
    striped multiplies the server opened and the calls that joined them."""
    url = "http://127.0.0.1:%d/metrics" % server.metrics_port
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = {}
    for kind, value in re.findall(
            r'^matmul_stream_stripes_total\{kind="(start|join)"\}\s+(\S+)',
            text, re.M):
        found[kind] = float(value)
    assert set(found) == {"start", "join"}, text
    return found


def assert_striped(server, before, stripes, multiplies):
    """Since `before` (stripe_counters), every one of `multiplies` was
    striped over `stripes` calls: opened once, joined by the other calls;
    with one stripe, nothing was."""
    after = stripe_counters(server)
    started = after["start"] - before["start"]
    joined = after["join"] - before["join"]
    if stripes == 1:
        assert started == 0 and joined == 0
    else:
        assert started == multiplies
        assert joined == (stripes - 1) * started


def check_streamed_point(p, stripes, chunk_bytes, rate=None):
    check_point_sane(p)
    assert p["streamed"] is True
    assert p["stream"] == {"stripes": stripes, "chunk_bytes": chunk_bytes}
    if rate is None:
        assert p["mode"] == "closed" and p["rate"] is None
        assert p["delayed_starts"] == 0
    else:
        assert p["mode"] == "open" and p["rate"] == rate
    assert p["errors"] == 0, p["error_messages"]
    assert p["errors_by_code"] == {}
    assert p["abandoned"] == 0
    assert p["resident"] == "none" and p["shared_memory"] is False
    assert p["verify"]["enabled"] and p["verify"]["checked"] > 0
    assert p["verify"]["mismatches"] == 0
    # The payload goes both ways, as inline; the message sizes are it.
    assert p["request_bytes"] > 0 and p["response_bytes"] > 0
    assert p["request_message_bytes"] == p["request_bytes"]
    assert p["response_message_bytes"] == p["response_bytes"]
    # Each striped multiply takes a connection per stripe.
    assert p["channels"] >= stripes


@pytest.mark.parametrize("stripes", [1, 3])
def test_stream_sweep_with_verify_and_server_metrics(tmp_path, stripes):
    """--stream: each multiply over MultiplyStream in 1 KiB chunks (A is 7.5
    KiB), striped over --stripes calls; the products verified, the report
    and JSON say so, and the server saw striped multiplies only with
    stripes > 1."""
    s = Server(metrics=True)
    try:
        before = stripe_counters(s)
        out = tmp_path / "stream.json"
        r = bench("--target", s.target, "--shape", "48x40x24",
                  "--concurrency", "1,2", "--duration", "0.5",
                  "--warmup", "0.2", "--stream", "--stream-chunk-bytes",
                  "1024", "--stripes", stripes, "--verify-every", "2",
                  "--server-metrics", "127.0.0.1:%d" % s.metrics_port,
                  "--label", "e2e stream", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ("streamed (MultiplyStream) over %d stripe(s), 1.0 KiB chunks"
                % stripes) in r.stdout
        doc = load(out)
        assert doc["config"]["streamed"] is True
        assert doc["config"]["stream"] == {"stripes": stripes,
                                           "chunk_bytes": 1024}
        assert doc["config"]["verify"] is True
        points = doc["points"]
        assert [p["concurrency"] for p in points] == [1, 2]
        assert [p["channels"] for p in points] == [stripes, 2 * stripes]
        multiplies = 0
        for p in points:
            check_streamed_point(p, stripes, 1024)
            assert p["label"] == "e2e stream"
            assert p["request_bytes"] == (48 * 40 + 40 * 24) * 4
            assert p["response_bytes"] == 48 * 24 * 4
            assert 0.4 < p["elapsed_s"] < 1.5
            # The server's OK MultiplyStream multiplies over the point
            # (warm-up included) cover the bench's successes.
            m = p["server_metrics"]
            assert m["multiplies_ok"] >= p["ok"] > 0
            assert m["compute_busy_s"] > 0
            multiplies += m["multiplies_ok"]
        # Every multiply of the run was striped over `stripes` calls.
        assert_striped(s, before, stripes, multiplies)
    finally:
        assert s.stop() == 0, "".join(s.log)


@pytest.mark.parametrize("dtype,shape,stripes", [
    ("bfloat16", "2x16x64x8", 3),
    ("float64", "33x17x5", 1),
    ("float16", "20", 3),
])
def test_stream_by_count_verifies_every_product(server, tmp_path, dtype,
                                                shape, stripes):
    out = tmp_path / "stream.json"
    r = bench("--target", server.target, "--shape", shape, "--dtype", dtype,
              "--concurrency", "3", "--requests", "24", "--warmup", "0",
              "--stream", "--stream-chunk-bytes", "256", "--stripes", stripes,
              "--verify-every", "1", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_streamed_point(p, stripes, 256)
    assert p["requests"] == 24 and p["ok"] == 24
    assert p["verify"]["checked"] == 24 and p["verify"]["mismatches"] == 0
    assert p["requests_target"] == 24 and p["duration_s"] is None


def test_stream_stable_windows(server, tmp_path):
    out = tmp_path / "stream_stable.json"
    r = bench("--target", server.target, "--shape", "16", "--concurrency",
              "2", "--duration", "0.3", "--warmup", "0", "--stream",
              "--stripes", "2", "--stable", "--stable-windows", "3",
              "--verify", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_streamed_point(p, 2, 4 << 20)  # the default chunk size, 4 MiB
    windows = p["stability"]["window_requests_per_s"]
    assert len(windows) == 3
    assert p["requests_per_s"] == pytest.approx(windows[-1], rel=1e-9)
    if p["stability"]["stable"]:
        assert max(windows) <= 1.10 * min(windows)
        assert "stable after 3 windows" in r.stdout
    else:
        assert "NOT stable after 3 windows" in r.stdout


def test_stream_errors_counted_and_chunks_under_the_message_limit(tmp_path):
    """A server that takes messages of 4 KiB at most: 16 KiB chunks fail
    every streamed multiply (counted by code, exit 0 as for unary), 2 KiB
    chunks carry the same 32 KiB requests past the limit."""
    small = Server("--max-message-bytes", "4096")
    try:
        out = tmp_path / "stream_errors.json"
        r = bench("--target", small.target, "--shape", "64", "--stream",
                  "--concurrency", "2", "--duration", "0.5", "--warmup", "0",
                  "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "RESOURCE_EXHAUSTED" in r.stdout
        (p,) = load(out)["points"]
        assert p["streamed"] is True
        assert p["ok"] == 0 and p["requests_per_s"] == 0
        assert p["errors"] > 0
        assert p["errors_by_code"] == {"RESOURCE_EXHAUSTED": p["errors"]}
        assert p["error_messages"]["RESOURCE_EXHAUSTED"]
        assert p["latency_ms"]["count"] == 0

        r = bench("--target", small.target, "--shape", "64", "--stream",
                  "--stream-chunk-bytes", "2048", "--stripes", "2",
                  "--concurrency", "2", "--requests", "20", "--warmup", "0",
                  "--verify-every", "1", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        (p,) = load(out)["points"]
        check_streamed_point(p, 2, 2048)
        assert p["request_bytes"] == 2 * 64 * 64 * 4 > 4096
        assert p["ok"] == 20 and p["verify"]["checked"] == 20
    finally:
        assert small.stop() == 0, "".join(small.log)


def test_stream_channels_and_interrupt(server, tmp_path):
    """--channels below --stripes: the client opens a connection per stripe
    all the same (and the report says so); Ctrl-C ends the point after the
    calls in flight and reports it."""
    out = tmp_path / "stream_int.json"
    proc = subprocess.Popen(
        [str(BENCH), "--target", server.target, "--shape", "32",
         "--concurrency", "2,4", "--duration", "30", "--warmup", "0",
         "--stream", "--stripes", "3", "--channels", "1", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = read_to_table_header(proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    stdout = "".join(head) + stdout
    assert proc.returncode == 130, stdout + stderr
    (p,) = load(out)["points"]
    assert p["interrupted"] is True
    assert p["streamed"] is True and p["stream"]["stripes"] == 3
    assert p["concurrency"] == 2 and p["channels"] == 3
    assert p["ok"] > 0 and p["errors"] == 0, p["error_messages"]
    assert p["abandoned"] == 0


@pytest.mark.parametrize("stripes", [1, 3])
def test_stream_open_loop_by_count(tmp_path, stripes):
    """--stream --rate: 40 streamed multiplies started 20 ms apart (as
    test_fixed_rate's unary ones), each verified; the point says it was an
    open loop at 50/s, and with stripes > 1 the server striped every one of
    them (nothing else was sent: no warm-up, a count)."""
    s = Server(metrics=True)
    try:
        before = stripe_counters(s)
        out = tmp_path / "stream_rate.json"
        r = bench("--target", s.target, "--shape", "32", "--stream",
                  "--stripes", stripes, "--rate", "50", "--requests", "40",
                  "--concurrency", "8", "--warmup", "0", "--verify-every",
                  "1", "--json", out)
        assert r.returncode == 0, r.stdout + r.stderr
        (p,) = load(out)["points"]
        check_streamed_point(p, stripes, 4 << 20, rate=50)
        assert p["concurrency"] == 8 and p["channels"] >= stripes
        assert p["requests"] == 40 and p["ok"] == 40
        assert p["verify"]["checked"] == 40
        assert p["requests_target"] == 40 and p["duration_s"] is None
        # 40 starts 20 ms apart: the last one at 0.78 s.
        assert 0.7 < p["elapsed_s"] < 2.0
        assert 20 < p["requests_per_s"] < 60
        assert 0 <= p["delayed_starts"] <= 40
        # The table's rate column.
        row = [l for l in r.stdout.splitlines() if l.split()[:3] ==
               ["8", str(p["channels"]), "50"]]
        assert len(row) == 1, r.stdout
        assert_striped(s, before, stripes, 40)
    finally:
        assert s.stop() == 0, "".join(s.log)


def test_stream_open_loop_sweep_by_duration(server, tmp_path):
    """Each rate x each concurrency, measured for a duration after a
    warm-up, striped: the achieved rate is the requested one."""
    out = tmp_path / "stream_rates.json"
    r = bench("--target", server.target, "--shape", "24", "--stream",
              "--stripes", "2", "--stream-chunk-bytes", "1024",
              "--rate", "25,50", "--concurrency", "1,4", "--duration", "1",
              "--warmup", "0.2", "--verify-every", "2", "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    points = load(out)["points"]
    assert [(p["rate"], p["concurrency"]) for p in points] == [
        (25, 1), (25, 4), (50, 1), (50, 4)]
    for p in points:
        check_streamed_point(p, 2, 1024, rate=p["rate"])
        assert p["duration_s"] == 1 and p["requests_target"] is None
        assert 0.9 < p["elapsed_s"] < 1.5
        assert 0.4 * p["rate"] < p["requests_per_s"] < 1.2 * p["rate"]


def test_stream_open_loop_overloaded_counts_late_starts(server, tmp_path):
    """A rate far beyond one call at a time (a start due every 10 us): each
    start after the first finds the one worker busy and is late, and the
    latency runs from the scheduled start, so the last request's covers
    (nearly) the whole point, not just its own call."""
    out = tmp_path / "stream_late.json"
    r = bench("--target", server.target, "--shape", "64", "--stream",
              "--stripes", "2", "--rate", "100000", "--requests", "30",
              "--concurrency", "1", "--warmup", "0", "--verify-every", "1",
              "--json", out)
    assert r.returncode == 0, r.stdout + r.stderr
    (p,) = load(out)["points"]
    check_streamed_point(p, 2, 4 << 20, rate=100000)
    assert p["requests"] == 30 and p["ok"] == 30
    assert p["delayed_starts"] == 29
    # The 30th was due 0.29 ms after the start and ended the point.
    elapsed_ms = 1000 * p["elapsed_s"]
    assert elapsed_ms - 1 <= p["latency_ms"]["max"] <= elapsed_ms + 1
    assert p["requests_per_s"] < 100000


def test_stream_open_loop_interrupt_while_waiting(server, tmp_path):
    """Ctrl-C while the workers wait for starts due 10 s and more ahead:
    they give them up at once, and the point reports the one request it
    started (at 0 s) as interrupted."""
    out = tmp_path / "stream_rate_int.json"
    proc = subprocess.Popen(
        [str(BENCH), "--target", server.target, "--shape", "16", "--stream",
         "--rate", "0.1", "--concurrency", "4", "--duration", "60",
         "--warmup", "0", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    head = read_to_table_header(proc)
    time.sleep(1.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    stdout = "".join(head) + stdout
    assert proc.returncode == 130, stdout + stderr
    # Not after the next start (10 s) came due.
    assert time.monotonic() - signalled < 8
    (p,) = load(out)["points"]
    assert p["interrupted"] is True and p["abandoned"] == 0
    assert p["mode"] == "open" and p["rate"] == 0.1 and p["streamed"] is True
    assert p["requests"] == 1 and p["ok"] == 1 and p["errors"] == 0


@pytest.mark.parametrize("args,message", [
    (["--stream", "--rate", "0"], "--rate takes positive numbers"),
    (["--stream", "--rate", "10,-1"], "--rate takes positive numbers"),
    (["--stream", "--rate", "10", "--resident"], "not with --resident"),
    (["--stream", "--rate", "10", "--shared-memory"],
     "not with --shared-memory"),
    (["--stream", "--rate", "10", "--concurrency", "300"],
     "--concurrency is at most 256 with it, got 300"),
    (["--stream", "--rate", "10", "--stripes", "17"],
     "--stripes takes 1 to 16"),
    (["--rate", "10", "--stripes", "2"],
     "--stripes applies only with --stream"),
    (["--stream", "--resident"], "not with --resident"),
    (["--stream", "--resident=operands"], "not with --resident"),
    (["--stream", "--shared-memory"], "not with --shared-memory"),
    (["--stream", "--protobuf-requests"], "not with --protobuf-requests"),
    (["--stripes", "2"], "--stripes applies only with --stream"),
    (["--stream-chunk-bytes", "4096"],
     "--stream-chunk-bytes applies only with --stream"),
    (["--stream", "--stripes", "17"], "--stripes takes 1 to 16"),
    (["--stream", "--concurrency", "4,257"],
     "--concurrency is at most 256 with it, got 257"),
    (["--stream", "--stripes", "0"], "--stripes takes a positive integer"),
    (["--stream", "--stream-chunk-bytes", "0"],
     "--stream-chunk-bytes takes a positive integer"),
    (["--stream", "--stream-chunk-bytes", "2147483648"],
     "--stream-chunk-bytes is at most"),
])
def test_stream_refuses_what_does_not_apply(server, args, message):
    r = bench("--target", server.target, "--shape", "8", *args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert r.stderr.startswith("matmul-bench: "), r.stderr
    assert message in r.stderr, r.stderr
    assert r.stderr.endswith("; see --help\n"), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stdout == ""  # refused before any point ran
    r = bench("--help")
    for flag in ("--stream", "--stream-chunk-bytes", "--stripes"):
        assert flag in r.stdout
