"""Batching is on by default in the real binary, and adaptive.

A matmul-server (host engine, one worker lane so that one job holds the
only slot) gets 320 multiplies of 256x256 float32 from 32 threads at once:
every answer matches NumPy, and the server's matmul_batch_size histogram
accounts for every request (its sum) in fewer launches than requests (what
arrived while the lane was busy went out together). One client alone gets
launches of one. With --batch-window-us 0 there is no batching engine and
no histogram.
"""

from __future__ import annotations

import threading

import numpy as np

import matmul_client

from metrics_helpers import MetricsServer, http_get, parse_scrape

N = 256
THREADS = 32
EACH = 10


def _batch_sizes(server: MetricsServer):
    status, _, text = http_get(server.metrics_url + "/metrics")
    assert status == 200
    family = parse_scrape(text).get("matmul_batch_size")
    if family is None:
        return None
    samples = family["samples"]
    return samples["matmul_batch_size_count"], samples["matmul_batch_size_sum"], samples


def _multiply_from_threads(server: MetricsServer) -> list:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((N, N)).astype(np.float32)
    b = rng.standard_normal((N, N)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    problems: list = []

    def work() -> None:
        client = matmul_client.Client(server.target)
        try:
            for _ in range(EACH):
                c = client.multiply(a, b, timeout=120)
                if not np.allclose(c, expected, rtol=1e-4, atol=1e-3):
                    problems.append("wrong answer")
        except Exception as error:  # noqa: BLE001 - reported below
            problems.append(repr(error))
        finally:
            client.close()

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a client thread did not finish"
    return problems


def test_concurrent_small_multiplies_share_launches_by_default():
    server = MetricsServer("--streams-per-device", "1")
    try:
        problems = _multiply_from_threads(server)
        assert not problems, problems[:5]
        sizes = _batch_sizes(server)
        assert sizes is not None, "no matmul_batch_size: batching is not on by default"
        count, total, samples = sizes
        assert total == THREADS * EACH
        print(f"{total:.0f} requests in {count:.0f} launches")
        assert count < total, f"{count} launches for {total} requests: nothing was batched"
        # One client alone: each request goes out at once, alone.
        before = samples['matmul_batch_size_bucket{le="1"}']
        client = matmul_client.Client(server.target)
        x = np.eye(8, dtype=np.float32)
        for _ in range(5):
            np.testing.assert_array_equal(client.multiply(x, x), x)
        client.close()
        count2, total2, samples2 = _batch_sizes(server)
        assert total2 == total + 5 and count2 == count + 5
        assert samples2['matmul_batch_size_bucket{le="1"}'] == before + 5
    finally:
        status = server.stop()
    assert status == 0, server.output()


def test_batch_window_zero_turns_batching_off():
    server = MetricsServer("--batch-window-us", "0")
    try:
        client = matmul_client.Client(server.target)
        x = np.eye(4, dtype=np.float32)
        np.testing.assert_array_equal(client.multiply(x, x), x)
        client.close()
        assert _batch_sizes(server) is None
    finally:
        status = server.stop()
    assert status == 0, server.output()
