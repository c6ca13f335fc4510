"""Fixtures for the Python client's tests: real matmul-server processes.

The server binary is $MATMUL_BIN_DIR/matmul-server (default: build/bin of this
checkout); matmul_client must be importable: installed in the Python that
runs pytest (ctest installs it into build/python-venv), or from the build
tree (PYTHONPATH=build/python, the quick loop). Each
server runs the host engine on 127.0.0.1 with a port the kernel picks, and is
stopped with SIGTERM at the end, which must make it exit with status 0.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

try:
    import matmul_client
except ImportError as error:
    raise pytest.UsageError(
        f"cannot import matmul_client ({error}): pip install ./client/python, or build the "
        f"matmul_python target and run with PYTHONPATH=<build>/python"
    ) from error

_REPO_ROOT = Path(__file__).resolve().parents[2]
_START_TIMEOUT_S = 30
_STOP_TIMEOUT_S = 30


def _free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A matmul-server child process on 127.0.0.1; ``target`` is its address."""

    def __init__(self, *flags: str, metrics: bool = False, engine: str = "host") -> None:
        """``metrics``: serve /metrics on a free loopback port (``gauge``);
        ``engine``: --engine (the CUDA engine only for GPU tests)."""
        binary = Path(os.environ.get("MATMUL_BIN_DIR", _REPO_ROOT / "build" / "bin")) / "matmul-server"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} not found: build matmul-server or set MATMUL_BIN_DIR")
        # The metrics port is picked here (--metrics-port 0 disables the
        # endpoint) and released before the server binds it: another process
        # may take it in between, so retry with another one.
        for _ in range(5 if metrics else 1):
            self.log: List[str] = []
            self.port: Optional[int] = None
            self.metrics_port: Optional[int] = None
            self._ready = threading.Event()
            self._process = subprocess.Popen(
                [str(binary), "--host", "127.0.0.1", "--port", "0",
                 "--metrics-port", str(_free_port() if metrics else 0),
                 "--engine", engine, *flags],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            # Keep draining stderr so that the server never blocks on a full pipe.
            reader = threading.Thread(target=self._read_log, daemon=True)
            reader.start()
            if self._ready.wait(_START_TIMEOUT_S) and self.port is not None:
                return
            self._process.kill()
            self._process.wait()
            reader.join(5)  # all of this try's log, before the next one starts
            if "cannot serve metrics" not in self.output():
                break  # not a metrics port clash: another try would not help
        raise RuntimeError(f"matmul-server did not start:\n{self.output()}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return "".join(self.log)

    def gauge(self, name: str) -> float:
        """The value of an unlabelled gauge on the server's /metrics."""
        assert self.metrics_port is not None, "the server logged no metrics port"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(url, timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError(f"{name} is not on /metrics")

    def wait_for_gauge(self, name: str, value: float, timeout: float = 30) -> None:
        """Polls /metrics until ``name`` reads at least ``value``."""
        deadline = time.monotonic() + timeout
        seen = self.gauge(name)
        while seen < value:
            assert time.monotonic() < deadline, f"{name} stayed at {seen}, below {value}"
            time.sleep(0.02)
            seen = self.gauge(name)

    def stop(self) -> int:
        """Sends SIGTERM and returns the exit status."""
        self._process.send_signal(signal.SIGTERM)
        try:
            return self._process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise

    def _read_log(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            self.log.append(line)
            metrics = re.search(r"metrics on port (\d+)", line)
            if metrics and self.metrics_port is None:
                self.metrics_port = int(metrics.group(1))
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()  # The server exited (before or after serving).


def _serve(*flags: str) -> Iterator[ServerProcess]:
    server = ServerProcess(*flags)
    yield server
    status = server.stop()
    assert status == 0, f"matmul-server exited with {status} after SIGTERM:\n{server.output()}"


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """A server with the default limits, shared by the whole session."""
    yield from _serve()


@pytest.fixture(scope="session")
def small_server() -> Iterator[ServerProcess]:
    """A server with small limits: 64 KiB messages, 10,000 elements per operand."""
    yield from _serve("--max-message-bytes", "65536", "--max-elements-per-operand", "10000")


#: Stored-tensor limits of ``quota_server``.
QUOTA_HANDLES = 4
QUOTA_BYTES = 4096
QUOTA_MAX_TTL_S = 60


@pytest.fixture(scope="session")
def quota_server() -> Iterator[ServerProcess]:
    """A server with small stored-tensor quotas: 4 tensors and 4096 bytes per
    client, TTLs up to 60 s."""
    yield from _serve(
        "--max-handles-per-client", str(QUOTA_HANDLES),
        "--max-stored-bytes-per-client", str(QUOTA_BYTES),
        "--max-handle-ttl", f"{QUOTA_MAX_TTL_S}s",
    )


#: The two engines of Client.multiply: the native core (matmul_client._native)
#: and the pure-Python gRPC path. Tests that take ``client`` run on both; the
#: native one is skipped where the extension does not import (or with
#: MATMUL_CLIENT_NATIVE=0, which also keeps every other Client pure Python).
ENGINES = ["native", "pure"]


def make_client(target: str, engine: str, **kwargs) -> matmul_client.Client:
    """A Client of ``target`` on ``engine`` ("native" or "pure"); skips the
    test when the native engine is asked for and cannot be had."""
    if engine == "native":
        from matmul_client import _client

        if _client.NATIVE_UNAVAILABLE is not None:
            pytest.skip(f"native engine: {_client.NATIVE_UNAVAILABLE}")
    c = matmul_client.Client(target, native=engine == "native", **kwargs)
    assert c.native == (engine == "native")
    return c


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """"native" or "pure": the engine of ``client``."""
    return request.param


@pytest.fixture(scope="session")
def client(server: ServerProcess, engine: str) -> Iterator[matmul_client.Client]:
    """A client of ``server`` on each engine, connected; every call has a
    60 s deadline unless it sets one.

    A fresh channel's first connect can fail on a sound loopback server (CI
    saw ``UNKNOWN: ... No such file or directory`` under ASan;
    docs/RELIABILITY.md), which would fail whichever test made the first
    call. wait_for_connected rides that out by gRPC's reconnect backoff."""
    with make_client(server.target, engine, timeout=60) as c:
        c.wait_for_connected(timeout=60)
        yield c
