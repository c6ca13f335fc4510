"""Fixtures of the metrics tests (helpers: metrics_helpers.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from metrics_helpers import MetricsServer


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    s = MetricsServer("--streams-per-device", "4")
    yield s
    status = s.stop()
    assert status == 0, f"matmul-server exited with {status}:\n{s.output()}"
