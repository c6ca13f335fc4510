"""The drain on SIGTERM, end to end on the real binary: a long multiply in
flight completes, health reports NOT_SERVING during the grace period, new
calls then get UNAVAILABLE, and the process exits 0."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import matmul_client
from conftest import ServerProcess


def _long_calls(server: ServerProcess, count: int, n: int = 2048):
    """``count`` multiplies of two n x n float64 operands, queued on the
    server's one lane (2048: half a second or more each on two cores), all
    admitted when this returns; and their operands (the product is computed
    by the caller after what it times, since NumPy competes for the cores). The
    operands are stored first, so that each request is a few bytes and is
    admitted at once (three 256 MiB requests took longer than a fixed wait
    to arrive on a busy 2-core machine)."""
    client = matmul_client.Client(server.target)
    rng = np.random.default_rng(11)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))
    ha = client.upload(a)
    hb = client.upload(b)
    calls = [client.multiply_async(ha, hb) for _ in range(count)]
    server.wait_for_gauge("matmul_inflight_requests", count)
    return calls, (a, b)


def test_sigterm_drains_in_flight_work_and_refuses_new_work():
    server = ServerProcess("--drain-grace", "1.5s", "--drain-timeout", "300s",
                           "--streams-per-device", "1", metrics=True)
    client = matmul_client.Client(server.target)
    rng = np.random.default_rng(7)
    # Three long multiplies on one lane run one after another, so admitted
    # work outlasts the grace period by seconds whatever the machine's speed
    # (one alone ended right at its end under ASan, and the server had
    # already begun gRPC's shutdown when the new call came).
    long_calls, (a, b) = _long_calls(server, 3, n=4096)
    assert not long_calls[-1].done()
    server._process.send_signal(signal.SIGTERM)

    # During the grace period: readiness is NOT_SERVING, liveness SERVING.
    deadline = time.monotonic() + 1.0
    readiness = "SERVING"
    while readiness == "SERVING" and time.monotonic() < deadline:
        readiness = client.health("readiness")
    assert readiness == "NOT_SERVING"
    assert client.health("liveness") == "SERVING"

    # After it: new work is refused with UNAVAILABLE while the long one runs.
    time.sleep(1.7)
    assert not long_calls[-1].done(), (
        f"the long multiplies ended before the grace did: {long_calls[-1].exception()}")
    small = rng.standard_normal((8, 8)).astype(np.float32)
    with pytest.raises(matmul_client.MatmulError) as refused:
        client.multiply(small, small, timeout=5)
    assert refused.value.code().name == "UNAVAILABLE"
    assert "shutting down" in refused.value.details()

    expected = a @ b
    for call in long_calls:
        np.testing.assert_allclose(call.result(timeout=120), expected, rtol=1e-9, atol=1e-9)
    assert server._process.wait(60) == 0
    assert "draining" in server.output()


def test_repeated_sigterm_never_cuts_a_drain_short():
    # Supervisors (Kubernetes, systemd) resend SIGTERM. OpenBLAS starts its
    # threads before main and leaves signals unblocked in them; a signal that
    # lands there used to take the default action and kill the process.
    server = ServerProcess("--drain-timeout", "60s", "--streams-per-device", "1", metrics=True)
    calls, (a, b) = _long_calls(server, 2)
    process = server._process
    process.send_signal(signal.SIGTERM)
    for _ in range(10):
        time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
    assert not calls[-1].done(), "the drain ended before the last SIGTERM: the test proves nothing"
    expected = a @ b
    for call in calls:
        np.testing.assert_allclose(call.result(timeout=120), expected, rtol=1e-9, atol=1e-9)
    assert process.wait(60) == 0, server.output()
    assert "again; the drain goes on" in server.output()
    assert "stopped" in server.output()


def test_sigint_during_the_drain_exits_at_once_and_says_so():
    # Ctrl-C pressed twice: the second ends the process without waiting,
    # deliberately (a log line and status 130), not by the default action.
    server = ServerProcess("--drain-timeout", "60s", "--streams-per-device", "1", metrics=True)
    calls, _ = _long_calls(server, 2)
    process = server._process
    process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    while "shutting down" not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    assert process.wait(10) == 130, server.output()
    assert not calls[-1].done() or calls[-1].exception() is not None
    assert "during the drain: exiting now" in server.output()
