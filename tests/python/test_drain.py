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


def test_sigterm_drains_in_flight_work_and_refuses_new_work():
    server = ServerProcess("--drain-grace", "1.5s", "--drain-timeout", "60s",
                           "--streams-per-device", "1")
    client = matmul_client.Client(server.target)
    rng = np.random.default_rng(7)
    # Three long multiplies on one lane run one after another, so admitted
    # work outlasts the grace period by seconds whatever the machine's speed
    # (one alone ended right at its end under ASan, and the server had
    # already begun gRPC's shutdown when the new call came).
    a = rng.standard_normal((4096, 4096))
    b = rng.standard_normal((4096, 4096))
    # Stored operands, so that each request is a few bytes and is admitted
    # at once: three 256 MiB requests took longer than the sleep below to
    # arrive on a busy 2-core machine, and the last came in after SIGTERM.
    ha = client.upload(a)
    hb = client.upload(b)
    long_calls = [client.multiply_async(ha, hb) for _ in range(3)]
    time.sleep(0.3)  # the requests are admitted, the first is computing
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
    assert refused.value.code.name == "UNAVAILABLE"
    assert "shutting down" in refused.value.details

    expected = a @ b
    for call in long_calls:
        np.testing.assert_allclose(call.result(timeout=120), expected, rtol=1e-9, atol=1e-9)
    assert server._process.wait(60) == 0
    assert "draining" in server.output()
