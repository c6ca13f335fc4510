"""Options and the server process of the soak test (soak_test.py).

The server binary is $MATMUL_BIN_DIR/matmul-server (default: build/bin of this
checkout); matmul_client must be importable (PYTHONPATH=build/python).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

_REPO_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 60
_STOP_TIMEOUT_S = 60


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="length of the soak phase (default: $MATMUL_SOAK_SECONDS, else 60)",
    )


@pytest.fixture(scope="session")
def soak_seconds(request: pytest.FixtureRequest) -> float:
    value = request.config.getoption("--soak-seconds")
    if value is None:
        value = float(os.environ.get("MATMUL_SOAK_SECONDS", "60"))
    if value <= 0:
        raise pytest.UsageError(f"--soak-seconds must be positive, got {value}")
    return value


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SoakServer:
    """A matmul-server child process on 127.0.0.1 with /metrics on a known port."""

    def __init__(self, engine: str, *flags: str) -> None:
        binary = Path(os.environ.get("MATMUL_BIN_DIR", _REPO_ROOT / "build" / "bin")) / "matmul-server"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} not found: build matmul-server or set MATMUL_BIN_DIR")
        self.engine = engine
        self.log: List[str] = []
        self.port: Optional[int] = None
        self.metrics_port: Optional[int] = None
        self._ready = threading.Event()
        # The metrics port is picked here (--metrics-port 0 disables the
        # endpoint); another process could take it in between, so retry.
        for attempt in range(3):
            self.log = []
            self._ready = threading.Event()
            requested_metrics_port = _free_port()
            # The environment the image ships (Dockerfile: MALLOC_ARENA_MAX).
            env = dict(os.environ)
            env.setdefault("MALLOC_ARENA_MAX", "2")
            self._process = subprocess.Popen(
                [str(binary), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(requested_metrics_port), "--engine", engine, *flags],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            # Keep draining stderr so that the server never blocks on a full pipe.
            threading.Thread(target=self._read_log, args=(self._process, self.log, self._ready),
                             daemon=True).start()
            # "metrics on port N" (when the build has the endpoint) comes
            # before "serving on port N".
            if self._ready.wait(_START_TIMEOUT_S) and self.port is not None:
                return
            self._process.kill()
            self._process.wait()
            if "metrics" not in self.output():
                break  # not a metrics port clash: retrying will not help
        raise RuntimeError(f"matmul-server did not start:\n{self.output()}")

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self._process.poll() is None

    def output(self) -> str:
        return "".join(self.log)

    def rss_bytes(self) -> int:
        """VmRSS from /proc/PID/status."""
        return self._status_kib("VmRSS") * 1024

    def peak_rss_bytes(self) -> int:
        """VmHWM (peak RSS) from /proc/PID/status."""
        return self._status_kib("VmHWM") * 1024

    def _status_kib(self, key: str) -> int:
        text = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE)
        assert match, f"no {key} in /proc/{self.pid}/status"
        return int(match.group(1))

    def stop(self, sigterms: int = 1) -> int:
        """Sends SIGTERM (``sigterms`` times, 20 ms apart, as supervisors
        resend it) and returns the exit status."""
        if self._process.poll() is not None:
            return self._process.returncode
        self._process.send_signal(signal.SIGTERM)
        for _ in range(sigterms - 1):
            time.sleep(0.02)
            if self._process.poll() is not None:
                break
            self._process.send_signal(signal.SIGTERM)
        try:
            return self._process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise

    def _read_log(self, process: subprocess.Popen, log: List[str], ready: threading.Event) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            log.append(line)
            metrics = re.search(r"metrics on port (\d+)", line)
            if metrics:
                self.metrics_port = int(metrics.group(1))
            serving = re.search(r"serving on port (\d+)", line)
            if serving and self.port is None:
                self.port = int(serving.group(1))
                ready.set()
        ready.set()  # The server exited (before or after serving).


@pytest.fixture(scope="session")
def soak_server() -> Iterator[SoakServer]:
    """The server under soak: host engine, or $MATMUL_SOAK_ENGINE (e.g. cuda)."""
    engine = os.environ.get("MATMUL_SOAK_ENGINE", "host")
    server = SoakServer(engine)
    yield server
    started = time.monotonic()
    status = server.stop(sigterms=3)
    print(f"matmul-server stopped with status {status} in {time.monotonic() - started:.1f} s "
          "(3 SIGTERMs)")
    assert status == 0, f"matmul-server exited with {status} after SIGTERM:\n{server.output()}"
