"""matmul_client.Client against a real matmul-server (host engine) on loopback.

Results are checked against numpy.matmul computed in float64 from the same
operands, by relative Frobenius error.
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from typing import Tuple

import grpc
import numpy as np
import pytest

import matmul_client
from conftest import ENGINES, make_client
from matmul_client import Client, MatmulError
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc

# Largest relative Frobenius error accepted, by dtype. bfloat16 operands are
# float32 arrays that the client rounds, so its error includes that rounding.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 1e-2, "bfloat16": 1e-2}
DTYPES = list(TOLERANCE)

Shape = Tuple[int, ...]

# (shape of op(a), shape of op(b)): 1x1, vectors as matrices, odd sizes,
# batched, and each way of broadcasting a 2-D or batch-1 operand.
SHAPES = [
    ((1, 1), (1, 1)),
    ((1, 7), (7, 1)),
    ((7, 1), (1, 5)),
    ((1, 5), (5, 9)),
    ((9, 5), (5, 1)),
    ((17, 31), (31, 13)),
    ((64, 33), (33, 65)),
    ((3, 4, 5), (3, 5, 6)),
    ((4, 5), (3, 5, 6)),
    ((3, 4, 5), (5, 6)),
    ((1, 4, 5), (3, 5, 6)),
    ((3, 4, 5), (1, 5, 6)),
    ((1, 2, 3), (3, 4)),
]


def shape_id(shapes: Tuple[Shape, Shape]) -> str:
    return "@".join("x".join(map(str, s)) for s in shapes)


def dtype_id(dtype) -> str:
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def swap_last(shape: Shape) -> Shape:
    return (*shape[:-2], shape[-1], shape[-2])


def operand(rng: np.random.Generator, shape: Shape, dtype: str) -> np.ndarray:
    """Uniform values in [-1, 1); bfloat16 operands are float32 arrays."""
    return rng.uniform(-1, 1, size=shape).astype(np.float32 if dtype == "bfloat16" else dtype)


def expected_product(a: np.ndarray, b: np.ndarray, transpose_a: bool, transpose_b: bool) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if transpose_a:
        a64 = np.swapaxes(a64, -1, -2)
    if transpose_b:
        b64 = np.swapaxes(b64, -1, -2)
    return np.matmul(a64, b64)


def assert_close(c: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    assert c.dtype == np.dtype(np.float32 if dtype == "bfloat16" else dtype)
    assert c.shape == expected.shape
    error = np.linalg.norm((c.astype(np.float64) - expected).ravel()) / np.linalg.norm(expected.ravel())
    assert error < TOLERANCE[dtype], f"relative error {error:.3g} for {dtype}"


def multiply_and_check(
    client: Client,
    rng: np.random.Generator,
    a_shape: Shape,
    b_shape: Shape,
    dtype: str,
    transpose_a: bool = False,
    transpose_b: bool = False,
) -> None:
    """Multiplies random operands whose op() have the given shapes, and checks."""
    a = operand(rng, swap_last(a_shape) if transpose_a else a_shape, dtype)
    b = operand(rng, swap_last(b_shape) if transpose_b else b_shape, dtype)
    c = client.multiply(
        a, b, transpose_a=transpose_a, transpose_b=transpose_b,
        dtype="bfloat16" if dtype == "bfloat16" else None,
    )
    assert_close(c, expected_product(a, b, transpose_a, transpose_b), dtype)


def random_case(rng: np.random.Generator) -> dict:
    """Random shapes (2-D or 3-D, broadcast or not), transposes and dtype."""
    m, k, n = rng.integers(1, 40, size=3)
    batch = int(rng.integers(1, 5))
    a_shape: Shape = (m, k) if rng.random() < 0.4 else (rng.choice([1, batch]), m, k)
    b_shape: Shape = (k, n) if len(a_shape) == 3 and rng.random() < 0.4 else (batch, k, n)
    return dict(
        a_shape=tuple(map(int, a_shape)), b_shape=tuple(map(int, b_shape)),
        dtype=str(rng.choice(DTYPES)),
        transpose_a=bool(rng.random() < 0.5), transpose_b=bool(rng.random() < 0.5),
    )


def free_port() -> int:
    """A loopback port nothing listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- results vs NumPy --------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", SHAPES, ids=shape_id)
def test_matches_numpy(client: Client, shapes: Tuple[Shape, Shape], dtype: str) -> None:
    multiply_and_check(client, np.random.default_rng(1), *shapes, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposes", [(True, False), (False, True), (True, True)], ids=str)
@pytest.mark.parametrize("shapes", [((17, 31), (31, 13)), ((4, 5), (3, 5, 6))], ids=shape_id)
def test_transposes(
    client: Client, shapes: Tuple[Shape, Shape], transposes: Tuple[bool, bool], dtype: str
) -> None:
    multiply_and_check(client, np.random.default_rng(2), *shapes, dtype, *transposes)


def test_random_shapes_and_dtypes(client: Client) -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        multiply_and_check(client, rng, **random_case(rng))


def test_tf32_is_close(client: Client) -> None:
    rng = np.random.default_rng(4)
    a, b = operand(rng, (33, 70), "float32"), operand(rng, (70, 20), "float32")
    c = client.multiply(a, b, compute="tf32")
    error = np.linalg.norm(c - expected_product(a, b, False, False)) / np.linalg.norm(a @ b)
    assert c.dtype == np.float32 and error < 1e-2  # TF32 has a 10-bit mantissa.


def test_bfloat16_results_are_exact_float32(client: Client) -> None:
    rng = np.random.default_rng(5)
    c = client.multiply(operand(rng, (8, 9), "bfloat16"), operand(rng, (9, 10), "bfloat16"), dtype="bfloat16")
    assert c.dtype == np.float32
    assert not np.any(c.view(np.uint32) & 0xFFFF), "low 16 bits of a bfloat16 value are zero"


@pytest.mark.parametrize(
    "layout",
    ["fortran", "sliced", "big_endian", "transposed_view", "batched_swapaxes_view", "list"],
)
def test_memory_layouts_and_byte_orders(client: Client, layout: str) -> None:
    rng = np.random.default_rng(6)
    base_a, base_b = rng.uniform(-1, 1, (12, 20)), rng.uniform(-1, 1, (20, 7))
    a, b = {
        "fortran": lambda: (np.asfortranarray(base_a), np.asfortranarray(base_b)),
        "sliced": lambda: (rng.uniform(-1, 1, (24, 60))[::2, ::3], base_b),
        "big_endian": lambda: (base_a.astype(">f8"), base_b.astype(">f8")),
        "transposed_view": lambda: (np.ascontiguousarray(base_a.T).T, base_b),
        "batched_swapaxes_view": lambda: (rng.uniform(-1, 1, (3, 20, 12)).swapaxes(1, 2), base_b),
        "list": lambda: (base_a.tolist(), base_b.tolist()),
    }[layout]()
    a_copy = np.array(a)
    c = client.multiply(a, b)
    assert_close(c, np.matmul(np.asarray(a), np.asarray(b)), "float64")
    np.testing.assert_array_equal(np.asarray(a), a_copy)  # Operands are not modified.


def test_transposed_views_with_transpose_flags(client: Client) -> None:
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-1, 1, (12, 20)), rng.uniform(-1, 1, (20, 7))
    c = client.multiply(a.T, b.T, transpose_a=True, transpose_b=True)
    assert_close(c, a @ b, "float64")


@pytest.mark.parametrize(
    "a_dtype,b_dtype,dtype,result_dtype",
    [
        (np.int32, np.int64, np.float64, np.float64),
        (np.float64, np.float64, np.float32, np.float32),
        (np.float32, np.float64, np.float64, np.float64),
        (np.float16, np.float32, np.float16, np.float16),
        (np.float64, np.float16, "bfloat16", np.float32),
        (np.bool_, np.uint8, "float32", np.float32),
        (np.float32, np.float32, ">f8", np.float64),
    ],
    ids=dtype_id,
)
def test_dtype_argument_converts_both_operands(client: Client, a_dtype, b_dtype, dtype, result_dtype) -> None:
    rng = np.random.default_rng(8)
    a = rng.integers(0, 2, (5, 6)).astype(a_dtype)
    b = rng.integers(0, 2, (6, 4)).astype(b_dtype)
    c = client.multiply(a, b, dtype=dtype)
    assert c.dtype == result_dtype
    np.testing.assert_array_equal(c, a.astype(np.float64) @ b.astype(np.float64))  # Small integers: exact.


def test_results_are_writable_native_arrays(client: Client) -> None:
    c = client.multiply(np.ones((2, 3), ">f4"), np.ones((3, 2), ">f4"))
    assert c.flags.writeable and c.flags.c_contiguous and c.dtype.isnative
    c[0, 0] = 7
    np.testing.assert_array_equal(c, [[7, 3], [3, 3]])


# --- server info and health --------------------------------------------------


def test_server_info(client: Client) -> None:
    info = client.server_info()
    assert isinstance(info, matmul_client.ServerInfo)
    assert info.engine == "host"
    assert set(info.dtypes) == {"float32", "float64", "float16", "bfloat16"}
    assert [d.index for d in info.devices] == [-1]
    assert info.limits.max_message_bytes == 1 << 30
    assert info.streams_per_device >= 1 and info.version


@pytest.mark.parametrize("service", ["", "matmul.v1.MatmulService", "liveness", "readiness"])
def test_health_serving(client: Client, service: str) -> None:
    assert client.health(service) == "SERVING"


def test_health_unknown_service(client: Client) -> None:
    with pytest.raises(MatmulError) as raised:
        client.health("no.such.Service")
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND


def test_dns_target_with_round_robin(server) -> None:
    with Client(f"dns:///127.0.0.1:{server.port}", timeout=30) as dns_client:
        np.testing.assert_array_equal(dns_client.multiply(np.eye(3), np.eye(3)), np.eye(3))


# --- errors -------------------------------------------------------------------


def test_inner_dimension_mismatch(client: Client) -> None:
    with pytest.raises(MatmulError) as raised:
        client.multiply(np.ones((3, 4)), np.ones((5, 6)))
    error = raised.value
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "inner dimensions differ" in error.details()
    assert str(error) == f"INVALID_ARGUMENT: {error.details()}"


_MISMATCHED = (np.ones((3, 4)), np.ones((5, 6)))


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.multiply(*_MISMATCHED),
        lambda c: c.multiply_streamed(*_MISMATCHED, chunk_bytes=64),
        lambda c: c.multiply_streamed(*_MISMATCHED, chunk_bytes=64, stripes=2),
        lambda c: c.multiply_async(*_MISMATCHED).result(timeout=60),
    ],
    ids=["multiply", "multiply_streamed", "striped", "multiply_async"],
)
def test_errors_are_grpc_rpc_errors(client: Client, call) -> None:
    """Code written for grpcio handles the client's errors as grpc's own:
    ``except grpc.RpcError``, then grpc's ``code()`` and ``details()``."""
    try:
        call(client)
    except grpc.RpcError as error:
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert type(error.details()) is str
        assert "inner dimensions differ" in error.details()
        assert isinstance(error, MatmulError)
    else:
        pytest.fail("the server multiplied operands whose inner dimensions differ")


def test_error_attributes_of_before_still_read(client: Client) -> None:
    """``.details`` is still the message and ``.code`` still compares equal
    to the code (with a DeprecationWarning) as when they were attributes."""
    with pytest.raises(MatmulError) as raised:
        client.multiply(*_MISMATCHED)
    error = raised.value
    assert "inner dimensions differ" in error.details
    assert error.details == error.details() and error.args == (error.code(), error.details())
    with pytest.warns(DeprecationWarning, match=r"use error\.code\(\)"):
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.warns(DeprecationWarning):
        assert error.code != grpc.StatusCode.NOT_FOUND
    with pytest.warns(DeprecationWarning):
        assert error.code.name == "INVALID_ARGUMENT"
    with pytest.warns(DeprecationWarning):
        assert error.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.warns(DeprecationWarning):
        assert {grpc.StatusCode.INVALID_ARGUMENT: "shape"}[error.code] == "shape"


def test_error_metadata_is_the_grpc_calls(client: Client) -> None:
    """The rest of grpc.RpcError's methods: the pure-Python engine's errors
    keep the failed gRPC call's; the native core has none to give."""
    with pytest.raises(MatmulError) as raised:
        client.multiply(*_MISMATCHED)
    error = raised.value
    if client.native:
        assert error.initial_metadata() is None and error.trailing_metadata() is None
        assert error.debug_error_string() is None
    else:
        assert isinstance(error.trailing_metadata(), tuple)
        assert "inner dimensions differ" in error.debug_error_string()


def test_transpose_makes_inner_dimensions_mismatch(client: Client) -> None:
    with pytest.raises(MatmulError) as raised:
        client.multiply(np.ones((3, 4)), np.ones((4, 6)), transpose_a=True)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_batch_mismatch(client: Client) -> None:
    with pytest.raises(MatmulError) as raised:
        client.multiply(np.ones((2, 3, 4)), np.ones((3, 4, 5)))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "batch dimensions differ" in raised.value.details()


def test_zero_sized_dimension(client: Client) -> None:
    with pytest.raises(MatmulError) as raised:
        client.multiply(np.ones((0, 3)), np.ones((3, 2)))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_mixed_dtypes_refused_by_client(client: Client) -> None:
    with pytest.raises(TypeError, match="same dtype"):
        client.multiply(np.ones((2, 2), np.float32), np.ones((2, 2), np.float64))


def test_mixed_dtypes_refused_by_server(server) -> None:
    """A request that bypasses the client's check gets INVALID_ARGUMENT."""
    request = matmul_pb2.MultiplyRequest(
        a=matmul_pb2.Tensor(shape=[1, 1], dtype=matmul_pb2.DTYPE_FLOAT32, data=bytes(4)),
        b=matmul_pb2.Tensor(shape=[1, 1], dtype=matmul_pb2.DTYPE_FLOAT64, data=bytes(8)),
    )
    with grpc.insecure_channel(server.target) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            matmul_pb2_grpc.MatmulServiceStub(channel).Multiply(request, timeout=30)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "b.dtype" in raised.value.details()


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex64, np.bool_, object, "U3"], ids=dtype_id)
def test_unsupported_dtype_refused_by_client(client: Client, dtype) -> None:
    a = np.ones((2, 2), dtype=dtype)
    with pytest.raises(TypeError, match=r"has dtype .*float32, float64, float16 or bfloat16"):
        client.multiply(a, a)


@pytest.mark.parametrize("dtype", ["bf16", np.int32, "complex64", np.longdouble])
def test_unsupported_dtype_argument(client: Client, dtype) -> None:
    with pytest.raises(TypeError, match="dtype="):
        client.multiply(np.ones((2, 2)), np.ones((2, 2)), dtype=dtype)


def test_complex_operand_does_not_convert(client: Client) -> None:
    with pytest.raises(TypeError, match="does not convert"):
        client.multiply(np.ones((2, 2), np.complex128), np.ones((2, 2)), dtype=np.float64)


@pytest.mark.parametrize("a_shape", [(), (3,), (1, 2, 3, 3)], ids=str)
def test_operand_rank(client: Client, a_shape: Shape) -> None:
    with pytest.raises(ValueError, match="2-D .* or 3-D"):
        client.multiply(np.ones(a_shape), np.ones((3, 3)))


def test_unknown_compute_mode(client: Client) -> None:
    with pytest.raises(ValueError, match="compute="):
        client.multiply(np.ones((2, 2)), np.ones((2, 2)), compute="fp8")


def test_operand_over_element_limit(small_server) -> None:
    with Client(small_server.target, timeout=30) as small:
        assert small.server_info().limits.max_elements_per_operand == 10_000
        with pytest.raises(MatmulError) as raised:
            small.multiply(np.ones((101, 100), np.float16), np.ones((100, 2), np.float16))
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "elements per operand" in raised.value.details()


def test_request_over_message_limit(small_server) -> None:
    with Client(small_server.target, timeout=30) as small:
        assert small.server_info().limits.max_message_bytes == 65_536
        with pytest.raises(MatmulError) as raised:
            small.multiply(np.ones((90, 100)), np.ones((100, 1)))  # 72 KB, 9,000 elements.
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_result_over_message_limit(small_server) -> None:
    with Client(small_server.target, timeout=30) as small:
        with pytest.raises(MatmulError) as raised:
            small.multiply(np.ones((100, 1)), np.ones((1, 100)))  # C: 80 KB.
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max message size" in raised.value.details()


def test_client_option_overrides_default(server) -> None:
    options = [("grpc.max_receive_message_length", 1024)]
    with Client(server.target, timeout=30, options=options) as limited:
        limited.multiply(np.ones((4, 4)), np.ones((4, 4)))
        with pytest.raises(MatmulError) as raised:
            limited.multiply(np.ones((40, 4)), np.ones((4, 40)))  # C: 12.8 KB.
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def big_operands() -> Tuple[np.ndarray, np.ndarray]:
    """Two 1024x1024 float64 matrices: 16 MiB to send, ~2 GFLOP to compute."""
    rng = np.random.default_rng(9)
    return rng.standard_normal((1024, 1024)), rng.standard_normal((1024, 1024))


def test_deadline_exceeded(client: Client, big_operands) -> None:
    with pytest.raises(MatmulError) as raised:
        client.multiply(*big_operands, timeout=0.001)
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


def test_client_default_timeout(server, big_operands) -> None:
    with Client(server.target, timeout=0.001) as hasty:
        with pytest.raises(MatmulError) as raised:
            hasty.multiply(*big_operands)
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("engine", ENGINES)
def test_wait_for_connected(server, engine: str) -> None:
    with make_client(server.target, engine) as c:
        c.wait_for_connected(timeout=30)
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(c.multiply(a, a.T), a @ a.T)
        # Striped multiplies' own connections are waited for too.
        c.multiply_streamed(a, a.T, chunk_bytes=8, stripes=3)
        c.wait_for_connected(timeout=30)


@pytest.mark.parametrize("engine", ENGINES)
def test_wait_for_connected_with_no_server_runs_out_its_timeout(engine: str) -> None:
    with make_client(f"127.0.0.1:{free_port()}", engine) as nowhere:
        started = time.monotonic()
        with pytest.raises(MatmulError) as raised:
            nowhere.wait_for_connected(timeout=0.3)
        waited = time.monotonic() - started
    assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, raised.value
    assert "not connected after" in raised.value.details()
    assert 0.25 <= waited < 10, waited


def test_unreachable_server() -> None:
    with Client(f"127.0.0.1:{free_port()}", timeout=30) as nowhere:
        with pytest.raises(MatmulError) as raised:
            nowhere.multiply(np.ones((2, 2)), np.ones((2, 2)))
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        future = nowhere.multiply_async(np.ones((2, 2)), np.ones((2, 2)))
        assert isinstance(future.exception(timeout=30), MatmulError)
        assert future.exception().code() is grpc.StatusCode.UNAVAILABLE


# --- concurrency ----------------------------------------------------------------


def test_concurrent_calls_from_threads(client: Client) -> None:
    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        for _ in range(12):
            multiply_and_check(client, rng, **random_case(rng))
        return seed

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(worker, range(100, 108))) == list(range(100, 108))


def test_many_async_multiplies(client: Client) -> None:
    rng = np.random.default_rng(10)
    calls = []
    for i in range(200):
        a, b = rng.standard_normal((i % 17 + 1, 9)), rng.standard_normal((9, i % 5 + 1))
        calls.append((client.multiply_async(a, b), a @ b))
    done, not_done = concurrent.futures.wait([f for f, _ in calls], timeout=60)
    assert not not_done
    for future, expected in calls:
        assert_close(future.result(), expected, "float64")


def test_async_error_is_set_on_the_future(client: Client) -> None:
    future = client.multiply_async(np.ones((3, 4)), np.ones((5, 6)))
    error = future.exception(timeout=30)
    assert isinstance(error, MatmulError) and error.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(MatmulError):
        future.result()


def test_async_invalid_arguments_raise_at_once(client: Client) -> None:
    with pytest.raises(ValueError):
        client.multiply_async(np.ones(3), np.ones((3, 3)))


def test_async_cancel(client: Client, big_operands) -> None:
    future = client.multiply_async(*big_operands)
    assert future.cancel()
    assert future.cancelled()
    np.testing.assert_array_equal(client.multiply(np.eye(2), np.eye(2)), np.eye(2))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_multiply_streamed_matches_multiply(client: Client, dtype: str) -> None:
    rng = np.random.default_rng(5)
    a = rng.standard_normal((3, 67, 45))
    b = rng.standard_normal((45, 33))
    convert = None if dtype == "bfloat16" else np.dtype(dtype)
    if convert is not None:
        a, b = a.astype(convert), b.astype(convert)
    kwargs = {"dtype": "bfloat16"} if dtype == "bfloat16" else {}
    # Chunks far smaller than the operands: many of each, ending mid-row.
    streamed = client.multiply_streamed(a, b, chunk_bytes=1000, **kwargs)
    unary = client.multiply(a, b, **kwargs)
    assert streamed.shape == unary.shape == (3, 67, 33)
    assert streamed.dtype == unary.dtype
    np.testing.assert_array_equal(streamed, unary)


def test_multiply_streamed_with_a_stored_operand_and_transposes(client: Client) -> None:
    rng = np.random.default_rng(6)
    a = rng.standard_normal((40, 30)).astype(np.float32)
    b = rng.standard_normal((20, 40)).astype(np.float32)
    stored = client.upload(b)
    c = client.multiply_streamed(a, stored, transpose_a=True, transpose_b=True, chunk_bytes=256)
    np.testing.assert_allclose(c, a.T @ b.T, rtol=1e-5, atol=1e-5)
    stored.delete()


@pytest.mark.parametrize("stripes", [2, 4])
def test_multiply_streamed_striped_matches_numpy(client: Client, stripes: int) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 67, 45)).astype(np.float32)
    b = rng.standard_normal((45, 33)).astype(np.float32)
    # Chunks far smaller than the operands: spread over every call.
    c = client.multiply_streamed(a, b, chunk_bytes=1000, stripes=stripes)
    assert c.shape == (3, 67, 33) and c.dtype == np.float32
    np.testing.assert_allclose(c, np.matmul(a.astype(np.float64), b), rtol=1e-4, atol=1e-4)
    # The same product as one stream.
    np.testing.assert_allclose(
        c, client.multiply_streamed(a, b, chunk_bytes=1000), rtol=1e-5, atol=1e-5
    )
    # float64, transposed, a stored operand.
    x = rng.standard_normal((40, 30))
    y = rng.standard_normal((20, 40))
    stored = client.upload(y)
    c = client.multiply_streamed(
        x, stored, transpose_a=True, transpose_b=True, chunk_bytes=512, stripes=stripes
    )
    np.testing.assert_allclose(c, x.T @ y.T, rtol=1e-12, atol=1e-12)
    stored.delete()
    # The server's error, with its code.
    with pytest.raises(MatmulError) as mismatch:
        client.multiply_streamed(a, a, stripes=stripes)
    assert mismatch.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_multiply_streamed_picks_stripes_and_chunks_from_the_size() -> None:
    from matmul_client._streamed import _stream_plan, _wire_bytes

    mib = 1 << 20
    # As the C++ library's StreamOptionsFor (matmul_client_test.cc).
    assert _stream_plan(0, None, None) == (4 * mib, 1)
    assert _stream_plan(191 * mib, None, None) == (4 * mib, 1)
    assert _stream_plan(192 * mib, None, None) == (4 * mib, 2)
    assert _stream_plan(768 * mib, None, None) == (16 * mib, 8)
    assert _stream_plan(3072 * mib, None, None) == (16 * mib, 8)
    assert _stream_plan(3072 * mib, None, None, can_stripe=False) == (16 * mib, 1)
    assert _stream_plan(3072 * mib, mib, 3) == (mib, 3)
    # What travels: both arrays and the product; a handle counts nothing.
    a = np.zeros((2, 64, 32), np.float32)
    b = np.zeros((16, 32), np.float32)
    assert _wire_bytes(a, b, False, True) == a.nbytes + b.nbytes + 2 * 64 * 16 * 4
    assert _wire_bytes(a, object(), False, False) == a.nbytes


def test_multiply_streamed_errors(client: Client) -> None:
    a = np.ones((4, 5), np.float32)
    with pytest.raises(MatmulError) as mismatch:
        client.multiply_streamed(a, a)
    assert mismatch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "5" in mismatch.value.details()
    with pytest.raises(ValueError):
        client.multiply_streamed(a, a.T, chunk_bytes=0)
    # Striping takes 1 to 16 calls; refused before anything is sent.
    for stripes in (0, -1, 17):
        with pytest.raises(ValueError, match=f"stripes={stripes}: expected 1 to 16"):
            client.multiply_streamed(a, a.T, stripes=stripes)
    with pytest.raises(TypeError):
        client.multiply_streamed(a, a.T, stripes=2.0)
