"""Stored tensors of any size (issue 57 item 3): upload and download in chunks
(UploadStream, DownloadStream) with Client and AsyncClient, on the native core
and the pure-Python path, against a real matmul-server (host engine).

A 1.2 GiB float32 tensor, over the server's 1 GiB messages, goes up and comes
back bit for bit; small tensors are forced through the chunked path to check
every dtype, layout and the quota.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
import pytest

from conftest import ENGINES, QUOTA_BYTES, make_client
from matmul_client import MatmulError, _stored_chunks
from matmul_client.aio import AsyncClient


@pytest.fixture
def always_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python path sends every upload in chunks of 1000 bytes."""
    monkeypatch.setattr(_stored_chunks, "UPLOAD_CHUNKED_ABOVE_BYTES", 0)
    monkeypatch.setattr(_stored_chunks, "UPLOAD_CHUNK_BYTES", 1000)


def test_1_2_gib_round_trips_bit_exact(server) -> None:
    # 19661 x 16384 float32 = 1.2 GiB. Values from the index: cheap to make
    # and to check, and no two rows alike. On the pure-Python path (the
    # native core is the C++ library, whose own test stores 1.2 GiB).
    engine = "pure"
    rows, cols = 19661, 16384
    x = np.arange(rows * cols, dtype=np.uint32).view(np.float32).reshape(rows, cols)
    assert x.nbytes > 1.2 * (1 << 30) - 1
    with make_client(server.target, engine, timeout=120) as client:
        started = time.monotonic()
        handle = client.upload(x)
        uploaded = time.monotonic()
        assert handle.shape == (rows, cols)
        assert handle.bytes == x.nbytes
        back = client.download(handle)
        downloaded = time.monotonic()
        assert back.dtype == np.float32 and back.shape == (rows, cols)
        assert np.array_equal(back.view(np.uint32), x.view(np.uint32))
        del back
        client.delete(handle)
    print(f"{engine}: 1.2 GiB upload {uploaded - started:.2f} s, download {downloaded - uploaded:.2f} s")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1), (37, 29), (3, 40, 17)], ids=str)
def test_chunked_round_trip(server, always_chunked, dtype: str, shape) -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, size=shape).astype(np.float32 if dtype == "bfloat16" else dtype)
    with make_client(server.target, "pure", timeout=60) as client:
        handle = client.upload(x, dtype="bfloat16" if dtype == "bfloat16" else None, ttl=100)
        assert handle.shape == shape and handle.dtype == dtype
        back = client.download(handle)
        if dtype == "bfloat16":
            bits = x.view(np.uint32).astype(np.uint64)
            x = ((((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)
        assert back.dtype == x.dtype
        assert np.array_equal(back, x)
        # A chunked upload is a stored tensor like any other.
        if len(shape) == 2 and dtype == "float32":
            np.testing.assert_allclose(client.multiply(handle, np.eye(shape[1], dtype=dtype)), x)
        client.delete(handle)


def test_chunked_upload_of_any_layout(server, always_chunked) -> None:
    x = np.arange(60 * 70, dtype=np.float64).reshape(60, 70)[::2, ::-1].T  # not contiguous
    with make_client(server.target, "pure", timeout=60) as client:
        handle = client.upload(x)
        assert np.array_equal(client.download(handle), x)
        client.delete(handle)


def test_chunked_upload_over_quota(quota_server, always_chunked) -> None:
    with make_client(quota_server.target, "pure", timeout=60, client_id="chunky") as client:
        with pytest.raises(MatmulError) as raised:
            client.upload(np.zeros((QUOTA_BYTES // 4 + 1, 1), np.float32))
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "chunky" in raised.value.details()
        # Nothing was charged: the whole quota is there.
        handle = client.upload(np.ones((QUOTA_BYTES // 4, 1), np.float32))
        client.delete(handle)


@pytest.mark.parametrize("engine", ENGINES)
def test_async_chunked_round_trip(server, always_chunked, engine: str) -> None:
    if engine == "native":
        from matmul_client import _client

        if _client.NATIVE_UNAVAILABLE is not None:
            pytest.skip(f"native engine: {_client.NATIVE_UNAVAILABLE}")
    # 80 MiB: over the size from which both engines send in chunks.
    x = np.arange(20 << 20, dtype=np.float32).reshape(5 << 10, 4 << 10)

    async def round_trip() -> None:
        async with AsyncClient(server.target, native=engine == "native", timeout=60) as client:
            handle = await client.upload(x)
            back = await client.download(handle)
            assert np.array_equal(back, x)
            await client.delete(handle)

    asyncio.run(asyncio.wait_for(round_trip(), 120))


@pytest.mark.parametrize("engine", ENGINES)
def test_over_a_small_servers_message_size(small_server, engine: str) -> None:
    # 80,000 bytes against 64 KiB messages: one message is refused, chunks
    # are not; the download comes in chunks under the limit.
    x = np.arange(100 * 100, dtype=np.float64).reshape(100, 100)
    with make_client(small_server.target, engine, timeout=60) as client:
        handle = client.upload(x)
        assert np.array_equal(client.download(handle), x)
        client.delete(handle)
