"""Helpers of the metrics tests (conftest.py holds the fixtures):
matmul-server child processes with their metrics port, free loopback ports,
plain HTTP GETs, a parser of the text exposition format.

The server binary is $MATMUL_BIN_DIR/matmul-server (default: build/bin of
this checkout). --metrics-port 0 disables metrics, so each server gets a
port picked here and retries with another if that one was taken meanwhile.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import List, Optional, Tuple

REPO_ROOT = Path(os.environ.get("MATMUL_REPO", Path(__file__).resolve().parents[2]))
BIN_DIR = Path(os.environ.get("MATMUL_BIN_DIR", REPO_ROOT / "build" / "bin"))
_START_TIMEOUT_S = 30
_STOP_TIMEOUT_S = 30


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10) -> Tuple[int, str, str]:
    """(status, content type, body) of a GET; HTTP errors are returned too."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return (response.status, response.headers.get("Content-Type", ""),
                    response.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Content-Type", ""), error.read().decode("utf-8")


class MetricsServer:
    """A matmul-server (host engine) on 127.0.0.1 with its metrics port."""

    def __init__(self, *flags: str) -> None:
        binary = BIN_DIR / "matmul-server"
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} not found: build matmul-server or set MATMUL_BIN_DIR")
        for _ in range(5):
            self.metrics_port = free_port()
            self._start(binary, flags)
            if self.port is not None:
                return
            self._process.wait()
            if "cannot serve metrics" not in self.output():
                break
        raise RuntimeError(f"matmul-server did not start:\n{self.output()}")

    def _start(self, binary: Path, flags) -> None:
        self.log: List[str] = []
        self.port: Optional[int] = None
        self._ready = threading.Event()
        self._process = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", "0",
             "--metrics-port", str(self.metrics_port), "--engine", "host", *flags],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._ready.wait(_START_TIMEOUT_S):
            self._process.kill()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def output(self) -> str:
        return "".join(self.log)

    def stop(self) -> int:
        """SIGTERM; returns the exit status."""
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
            match = re.search(r"serving on port (\d+)", line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._ready.set()
        self._ready.set()


def parse_scrape(text: str) -> dict:
    """{family name: {"type": ..., "samples": {series text: value}}}."""
    families: dict = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families.setdefault(name, {"type": kind, "samples": {}})["type"] = kind
        elif line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0]
            for suffix in ("_bucket", "_sum", "_count"):
                base = name[: -len(suffix)]
                if name.endswith(suffix) and families.get(base, {}).get("type") == "histogram":
                    name = base
            families.setdefault(name, {"type": "untyped", "samples": {}})["samples"][series] = float(value)
    return families
