"""Stored tensors with matmul_client against a real matmul-server (host engine):
Client.upload / download / delete, Handles as multiply operands, keep=True
chains, client ids and quotas, lifetimes, errors and concurrency.

Products are checked against numpy.matmul in float64, as in test_client.py.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Tuple

import grpc
import numpy as np
import pytest

from conftest import QUOTA_BYTES, QUOTA_HANDLES, QUOTA_MAX_TTL_S
from matmul_client import CLIENT_ID_METADATA_KEY, Client, Handle, MatmulError

TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-2, "bfloat16": 1e-2}
DTYPES = list(TOLERANCE)


def operand(rng: np.random.Generator, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
    """Uniform values in [-1, 1); bfloat16 operands are float32 arrays."""
    return rng.uniform(-1, 1, size=shape).astype(np.float32 if dtype == "bfloat16" else dtype)


def as_sent(x: np.ndarray, dtype: str) -> np.ndarray:
    """The values the server holds for ``x`` uploaded as ``dtype`` (bfloat16:
    rounded, to nearest even), in float64."""
    if dtype != "bfloat16":
        return x.astype(np.float64)
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32)
    return rounded.view(np.float32).astype(np.float64)


def upload_kw(dtype: str) -> dict:
    return {"dtype": "bfloat16"} if dtype == "bfloat16" else {}


def assert_close(c: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    assert c.dtype == np.dtype(np.float32 if dtype == "bfloat16" else dtype)
    assert c.shape == expected.shape
    error = np.linalg.norm((c.astype(np.float64) - expected).ravel()) / np.linalg.norm(expected.ravel())
    assert error < TOLERANCE[dtype], f"relative error {error:.3g} for {dtype}"


def expect_error(code: grpc.StatusCode, call, *args, **kwargs) -> MatmulError:
    with pytest.raises(MatmulError) as raised:
        call(*args, **kwargs)
    assert raised.value.code() is code, raised.value
    return raised.value


# --- upload and download ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (2, 5, 4)], ids=str)
def test_round_trip(client: Client, server, dtype: str, shape) -> None:
    x = operand(np.random.default_rng(1), shape, dtype)
    before = time.time()
    h = client.upload(x, ttl=120, **upload_kw(dtype))
    try:
        # The server on 127.0.0.1 advertises its address: the handle names
        # it and the device (common/handle_id.h).
        assert isinstance(h, Handle) and h.id.startswith(
            f"h1.{server.target}.-1.")
        assert h.shape == shape and h.ndim == len(shape)
        assert h.dtype == dtype
        assert h.device == -1
        assert h.bytes == x.size * (2 if dtype == "bfloat16" else x.itemsize)
        assert before + 119 <= h.expires <= time.time() + 121
        back = client.download(h)
        # bfloat16 comes back as float32, exactly the rounded values.
        assert back.dtype == np.dtype(np.float32 if dtype == "bfloat16" else dtype)
        assert back.flags.writeable and back.shape == shape
        np.testing.assert_array_equal(back.astype(np.float64), as_sent(x, dtype))
        np.testing.assert_array_equal(h.download(), back)  # bound to the client
    finally:
        client.delete(h)


def test_download_and_delete_by_id(client: Client) -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    h = client.upload(x)
    np.testing.assert_array_equal(client.download(h.id), x)
    client.delete(h.id)
    expect_error(grpc.StatusCode.NOT_FOUND, client.download, h.id)


def test_default_ttl_is_the_servers(client: Client) -> None:
    limits = client.server_info().limits
    assert limits.default_handle_ttl_seconds > 0
    assert limits.max_handle_ttl_seconds >= limits.default_handle_ttl_seconds
    assert limits.max_handles_per_client > 0 and limits.max_stored_bytes_per_client > 0
    with client.upload(np.ones((2, 2), np.float32)) as h:
        assert abs(h.expires - time.time() - limits.default_handle_ttl_seconds) < 5


@pytest.mark.parametrize("layout", ["fortran", "big-endian", "strided"])
def test_upload_any_layout(client: Client, layout: str) -> None:
    x = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    if layout == "fortran":
        y = np.asfortranarray(x)
    elif layout == "big-endian":
        y = x.astype(">f4")
    else:
        y = np.repeat(x, 2, axis=1)[:, ::2]
    with client.upload(y) as h:
        assert h.shape == (6, 8) and h.dtype == "float32"
        np.testing.assert_array_equal(client.download(h), x)


def test_upload_converts_with_dtype(client: Client) -> None:
    ints = np.arange(12).reshape(3, 4)
    with client.upload(ints, dtype=np.float64) as h:
        assert h.dtype == "float64"
        np.testing.assert_array_equal(client.download(h), ints)


def test_upload_refused_by_client(client: Client) -> None:
    with pytest.raises(ValueError):
        client.upload(np.ones(3))
    with pytest.raises(ValueError):
        client.upload(np.ones((1, 2, 3, 4)))
    with pytest.raises(TypeError):
        client.upload(np.ones((2, 2), np.int32))
    with pytest.raises(TypeError):
        client.upload(np.ones((2, 2), np.complex64), dtype=np.float32)
    for ttl in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            client.upload(np.ones((2, 2)), ttl=ttl)
    with pytest.raises(TypeError):
        client.upload(np.ones((2, 2)), ttl="10")
    with pytest.raises(TypeError):
        client.upload(np.ones((2, 2)), device="0")
    for bad in ("", None, 3):
        with pytest.raises((TypeError, ValueError)):
            client.download(bad)
        with pytest.raises((TypeError, ValueError)):
            client.delete(bad)


def test_upload_refused_by_server(client: Client) -> None:
    max_ttl = client.server_info().limits.max_handle_ttl_seconds
    error = expect_error(grpc.StatusCode.INVALID_ARGUMENT, client.upload, np.ones((2, 2)), ttl=max_ttl + 1)
    assert "ttl" in error.details()
    error = expect_error(grpc.StatusCode.INVALID_ARGUMENT, client.upload, np.ones((2, 2)), device=977)
    assert "device" in error.details()


# --- handles as operands ------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["a", "b", "both"])
def test_mixed_operands(client: Client, dtype: str, which: str) -> None:
    rng = np.random.default_rng(3)
    a, b = operand(rng, (3, 17, 9), dtype), operand(rng, (9, 5), dtype)
    expected = np.matmul(as_sent(a, dtype), as_sent(b, dtype))
    kw = upload_kw(dtype)
    with client.upload(a, **kw) as ha, client.upload(b, **kw) as hb:
        x = ha if which in ("a", "both") else a
        y = hb if which in ("b", "both") else b
        # An inline bfloat16 operand beside a stored one needs dtype="bfloat16".
        c = client.multiply(x, y, **(kw if which != "both" else {}))
        assert_close(c, expected, dtype)


@pytest.mark.parametrize("transposes", [(True, False), (False, True), (True, True)], ids=str)
def test_transposes_with_stored_operands(client: Client, transposes) -> None:
    ta, tb = transposes
    rng = np.random.default_rng(4)
    a = rng.standard_normal((9, 7) if ta else (7, 9))
    b = rng.standard_normal((4, 9) if tb else (9, 4))
    expected = (a.T if ta else a) @ (b.T if tb else b)
    with client.upload(a) as ha, client.upload(b) as hb:
        for x, y in ((ha, b), (a, hb), (ha, hb)):
            c = client.multiply(x, y, transpose_a=ta, transpose_b=tb)
            np.testing.assert_allclose(c, expected, rtol=1e-12, atol=1e-12)
        # A column-major array beside a handle travels with its flag flipped.
        c = client.multiply(ha, np.asfortranarray(b), transpose_a=ta, transpose_b=tb)
        np.testing.assert_allclose(c, expected, rtol=1e-12, atol=1e-12)


def test_broadcast_with_stored_operands(client: Client) -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((1, 4, 6)), rng.standard_normal((3, 6, 2))
    with client.upload(a) as ha:
        np.testing.assert_allclose(client.multiply(ha, b), np.matmul(a, b), rtol=1e-12)


def test_operand_dtype_rules(client: Client) -> None:
    f32, f64 = np.ones((2, 2), np.float32), np.ones((2, 2), np.float64)
    with client.upload(f32) as h32, client.upload(f64) as h64, client.upload(f32, dtype="bfloat16") as hbf:
        with pytest.raises(TypeError, match="float64"):
            client.multiply(h32, f64)
        with pytest.raises(TypeError, match="different dtypes"):
            client.multiply(h32, h64)
        with pytest.raises(TypeError, match="keeps its dtype"):
            client.multiply(h32, f64, dtype=np.float64)
        with pytest.raises(TypeError, match="bfloat16"):
            client.multiply(f32, hbf)
        # Converting the inline operand to the stored dtype is fine.
        np.testing.assert_array_equal(client.multiply(h32, f64, dtype=np.float32), 2 * f32)
        c = client.multiply(f32, hbf, dtype="bfloat16")
        assert c.dtype == np.float32
        np.testing.assert_array_equal(c, 2 * f32)
        # Two stored bfloat16 tensors: the product comes back as float32.
        c = client.multiply(hbf, hbf)
        assert c.dtype == np.float32
        np.testing.assert_array_equal(c, 2 * f32)
        # And with dtype="bfloat16", the same.
        np.testing.assert_array_equal(client.multiply(hbf, hbf, dtype="bfloat16"), 2 * f32)


def test_handle_of_another_client(server, client: Client) -> None:
    """Handle ids are capabilities: any client may use and delete them."""
    x = np.eye(3)
    h = client.upload(x)
    with Client(server.target, timeout=30, client_id="someone-else") as other:
        np.testing.assert_array_equal(other.multiply(h, x), x)
        other.delete(h.id)
    expect_error(grpc.StatusCode.NOT_FOUND, client.download, h)


# --- kept products and chains ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_keep_and_chain(client: Client, dtype: str) -> None:
    rng = np.random.default_rng(6)
    a, b, d = operand(rng, (2, 8, 6), dtype), operand(rng, (6, 5), dtype), operand(rng, (5, 3), dtype)
    kw = upload_kw(dtype)
    with client.upload(a, **kw) as ha:
        hab = client.multiply(ha, b, keep=True, result_ttl=30, **kw)
        with hab:
            assert isinstance(hab, Handle)
            assert hab.shape == (2, 8, 5) and hab.dtype == dtype
            assert time.time() + 28 <= hab.expires <= time.time() + 31
            ab = client.download(hab)
            assert_close(ab, np.matmul(as_sent(a, dtype), as_sent(b, dtype)), dtype)
            # The chain starts from the stored product as it is.
            abd = client.multiply(hab, d, **kw)
            assert_close(abd, np.matmul(ab.astype(np.float64), as_sent(d, dtype)), dtype)
            with client.multiply(hab, d, keep=True, **kw) as habd:
                assert habd.shape == (2, 8, 3)
                np.testing.assert_array_equal(client.download(habd), abd)
                # Kept x kept.
                with client.upload(d.swapaxes(0, 1).copy(), **kw) as hdt:
                    with client.multiply(habd, hdt, keep=True) as hsq:
                        assert hsq.shape == (2, 8, 5)


def test_keep_arguments(client: Client) -> None:
    with pytest.raises(ValueError, match="result_ttl"):
        client.multiply(np.eye(2), np.eye(2), result_ttl=5)
    with pytest.raises(ValueError):
        client.multiply(np.eye(2), np.eye(2), keep=True, result_ttl=0)
    max_ttl = client.server_info().limits.max_handle_ttl_seconds
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, client.multiply, np.eye(2), np.eye(2), keep=True,
                 result_ttl=max_ttl + 1)
    # Fractional TTLs round up.
    with client.multiply(np.eye(2), np.eye(2), keep=True, result_ttl=0.2) as h:
        assert time.time() < h.expires <= time.time() + 1.01


# --- errors and lifetimes ------------------------------------------------------------


def test_deleted_handle_is_not_found(client: Client) -> None:
    x = np.eye(4, dtype=np.float32)
    h = client.upload(x)
    h.delete()
    for call in (lambda: client.multiply(h, x), lambda: client.multiply(x, h),
                 lambda: client.multiply(h, x, keep=True), lambda: client.download(h),
                 lambda: client.delete(h), lambda: h.delete()):
        error = expect_error(grpc.StatusCode.NOT_FOUND, call)
        assert h.id in error.details()
    future = client.multiply_async(h, x)
    error = future.exception(timeout=30)
    assert isinstance(error, MatmulError) and error.code() is grpc.StatusCode.NOT_FOUND


def test_unknown_handle_is_not_found(client: Client) -> None:
    fake = Handle(id="h-0123", shape=(2, 2), dtype="float32", device=-1, bytes=16, expires=0.0)
    expect_error(grpc.StatusCode.NOT_FOUND, client.multiply, fake, np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError, match="not bound"):
        fake.download()


def test_expired_handle_is_not_found(client: Client) -> None:
    h = client.upload(np.eye(2), ttl=1)
    np.testing.assert_array_equal(client.download(h), np.eye(2))
    time.sleep(max(0.0, h.expires - time.time()) + 0.2)
    expect_error(grpc.StatusCode.NOT_FOUND, client.download, h)
    expect_error(grpc.StatusCode.NOT_FOUND, client.multiply, h, np.eye(2))


def test_shapes_that_do_not_chain(client: Client) -> None:
    with client.upload(np.ones((3, 4))) as h:
        error = expect_error(grpc.StatusCode.INVALID_ARGUMENT, client.multiply, h, np.ones((5, 2)))
        assert "inner dimensions" in error.details()


def test_context_manager(client: Client) -> None:
    with client.upload(np.eye(2)) as h:
        pass
    expect_error(grpc.StatusCode.NOT_FOUND, client.download, h)
    # Already deleted inside the block: leaving it is fine.
    with client.upload(np.eye(2)) as h:
        h.delete()
    # The block's exception propagates, and the tensor is deleted anyway.
    with pytest.raises(KeyError):
        with client.upload(np.eye(2)) as h:
            raise KeyError("boom")
    expect_error(grpc.StatusCode.NOT_FOUND, client.download, h)


def test_handle_value_semantics(client: Client) -> None:
    with client.upload(np.eye(2)) as h:
        assert "_client" not in repr(h) and h.id in repr(h)
        copy = Handle(h.id, h.shape, h.dtype, h.device, h.bytes, h.expires)
        assert copy == h and hash(copy) == hash(h)  # the client is not part of it


# --- client ids and quotas -----------------------------------------------------------


def test_client_id_validation(server) -> None:
    assert CLIENT_ID_METADATA_KEY == "x-matmul-client"
    for bad in ("", "caf\u00e9", "new\nline", "x" * 257):
        with pytest.raises(ValueError):
            Client(server.target, client_id=bad)
    with pytest.raises(TypeError):
        Client(server.target, client_id=7)
    with Client(server.target, client_id="ok id-1") as c:
        assert c.client_id == "ok id-1"
        with c.upload(np.eye(2)):
            pass


def test_quota_is_per_client_id(quota_server) -> None:
    small = np.ones((4, 4), np.float32)  # 64 bytes
    with Client(quota_server.target, timeout=30, client_id="alice") as alice, \
            Client(quota_server.target, timeout=30, client_id="bob") as bob:
        limits = alice.server_info().limits
        assert limits.max_handles_per_client == QUOTA_HANDLES
        assert limits.max_stored_bytes_per_client == QUOTA_BYTES
        assert limits.max_handle_ttl_seconds == QUOTA_MAX_TTL_S
        handles = [alice.upload(small) for _ in range(QUOTA_HANDLES)]
        error = expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, alice.upload, small)
        assert "alice" in error.details()
        # A kept product needs a handle too; a returned one does not.
        expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, alice.multiply, handles[0], small, keep=True)
        np.testing.assert_array_equal(alice.multiply(handles[0], small), small @ small)
        # Bob has his own quota, and may use alice's tensors.
        with bob.multiply(handles[0], handles[1], keep=True) as kept:
            np.testing.assert_array_equal(bob.download(kept), small @ small)
        # Deleting frees a slot.
        handles.pop().delete()
        handles.append(alice.upload(small))
        for h in handles:
            h.delete()
        # Bytes: more than the quota at once.
        error = expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, bob.upload,
                             np.ones((QUOTA_BYTES // 4 + 1, 1), np.float32))
        assert "bob" in error.details()
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, bob.upload, small, ttl=QUOTA_MAX_TTL_S + 1)


def test_without_client_id_the_address_is_charged(quota_server) -> None:
    """Two clients without ids on one machine share one quota."""
    small = np.ones((2, 2), np.float32)
    with Client(quota_server.target, timeout=30) as first, Client(quota_server.target, timeout=30) as second:
        handles = [first.upload(small) for _ in range(QUOTA_HANDLES)]
        try:
            expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, second.upload, small)
            with Client(quota_server.target, timeout=30, client_id="named") as named:
                with named.upload(small):
                    pass
        finally:
            for h in handles:
                h.delete()
        with second.upload(small):
            pass


# --- asynchronous calls and concurrency ------------------------------------------------


def test_multiply_async_with_handles(client: Client) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((16, 8)), rng.standard_normal((8, 4))
    with client.upload(a) as ha:
        futures = [client.multiply_async(ha, b, keep=True) for _ in range(20)]
        inline = [client.multiply_async(ha, b) for _ in range(20)]
        kept = [f.result(timeout=60) for f in futures]
        try:
            assert all(isinstance(h, Handle) for h in kept)
            assert len({h.id for h in kept}) == len(kept)
            for f in inline:
                np.testing.assert_allclose(f.result(timeout=60), a @ b, rtol=1e-12)
            for h in kept:
                np.testing.assert_allclose(client.download(h), a @ b, rtol=1e-12)
        finally:
            for h in kept:
                h.delete()


def test_concurrent_chains_from_threads(server) -> None:
    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        with Client(server.target, timeout=60, client_id=f"worker-{seed}") as c:
            for _ in range(6):
                m, k, n, p = (int(v) for v in rng.integers(1, 30, size=4))
                a, b, d = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal((n, p))
                with c.upload(a) as ha, c.multiply(ha, b, keep=True) as hab:
                    np.testing.assert_allclose(c.multiply(hab, d), a @ b @ d, rtol=1e-10, atol=1e-10)
        return seed

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(worker, range(200, 208))) == list(range(200, 208))


def test_shared_client_across_threads(client: Client) -> None:
    x = np.random.default_rng(8).standard_normal((5, 5))
    with client.upload(x) as h:
        def work(_: int) -> bool:
            with client.multiply(h, x, keep=True) as k:
                return bool(np.allclose(client.download(k), x @ x, rtol=1e-12))

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert all(pool.map(work, range(64)))
