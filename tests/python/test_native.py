"""The native engine of Client.multiply (matmul_client._native over the C++
client library) beside the pure-Python one: operands of every layout, byte
order and writability; errors with their gRPC codes; deadlines and the
client id on the wire; and the GIL released for the whole call.

The last three need to see the call from the server's side, so they run
against a small Python gRPC server in this process (``RecordingServer``):
it records each Multiply's metadata and deadline, and its handler can wait
for the test. That handler is Python: it can only run while the calling
thread does not hold the GIL, which makes "the GIL is released during the
call" a deterministic check, not a timing one.
"""

from __future__ import annotations

import concurrent.futures
import socket
import threading
from typing import Iterator, List, Optional, Tuple

import grpc
import numpy as np
import pytest

from conftest import ENGINES, make_client
from matmul_client import Client, MatmulError
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc
from matmul_client._tensors import resolve_wire_type, to_wire_array

_WAIT_S = 30  # bound on every wait for another thread; never reached when passing


# --- operands of any layout, on both engines -----------------------------------------


def _read_only(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x.flags.writeable = False
    return x


LAYOUTS = {
    "c_contiguous": lambda x: x,
    "fortran": np.asfortranarray,
    "non_contiguous_slice": lambda x: np.repeat(np.repeat(x, 2, axis=0), 3, axis=1)[::2, ::3],
    "negative_strides": lambda x: np.ascontiguousarray(x[::-1, ::-1])[::-1, ::-1],
    "big_endian": lambda x: x.astype(x.dtype.newbyteorder(">")),
    "big_endian_fortran": lambda x: np.asfortranarray(x.astype(x.dtype.newbyteorder(">"))),
    "read_only": _read_only,
    "read_only_buffer": lambda x: np.frombuffer(x.tobytes(), dtype=x.dtype).reshape(x.shape),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_operand_layouts(client: Client, layout: str, dtype: str) -> None:
    rng = np.random.default_rng(11)
    base_a = rng.integers(-4, 5, (13, 21)).astype(dtype)  # small integers: exact products
    base_b = rng.integers(-4, 5, (21, 6)).astype(dtype)
    a, b = LAYOUTS[layout](base_a), LAYOUTS[layout](base_b)
    before = (a.copy(), b.copy(), a.flags.writeable, b.flags.writeable)
    c = client.multiply(a, b)
    assert c.dtype == np.dtype(dtype) and c.dtype.isnative
    assert c.shape == (13, 6) and c.flags.c_contiguous and c.flags.writeable
    np.testing.assert_array_equal(c, base_a.astype(np.float64) @ base_b.astype(np.float64))
    # The operands are neither modified nor made writable.
    np.testing.assert_array_equal(a, before[0])
    np.testing.assert_array_equal(b, before[1])
    assert (a.flags.writeable, b.flags.writeable) == before[2:]


@pytest.mark.parametrize("layout", ["fortran", "big_endian", "read_only", "non_contiguous_slice"])
def test_streamed_operand_layouts(client: Client, layout: str) -> None:
    rng = np.random.default_rng(12)
    base_a = rng.integers(-4, 5, (2, 19, 23)).astype(np.float32)
    base_b = rng.integers(-4, 5, (23, 9)).astype(np.float32)
    transform = LAYOUTS[layout]
    if layout == "non_contiguous_slice":
        a = np.repeat(base_a, 2, axis=2)[:, :, ::2]
    else:
        a = transform(base_a)
    b = transform(base_b)
    c = client.multiply_streamed(a, b, chunk_bytes=100)
    np.testing.assert_array_equal(c, base_a.astype(np.float64) @ base_b.astype(np.float64))


def test_transposed_fortran_views_travel_without_a_copy() -> None:
    """The wire form of a C-contiguous little-endian operand is the operand
    itself, and of a Fortran-ordered one its transpose: no copy for either."""
    x = np.arange(12, dtype="<f4").reshape(3, 4)
    wire = resolve_wire_type(x, x, None)
    same, flipped = to_wire_array(x, wire, False)
    assert same is x and not flipped
    fortran = np.asfortranarray(x)
    view, flipped = to_wire_array(fortran, wire, False)
    assert flipped and np.shares_memory(view, fortran) and view.flags.c_contiguous
    big, _ = to_wire_array(x.astype(">f4"), wire, False)  # one copy, little-endian
    assert big.dtype == np.dtype("<f4") and big.flags.c_contiguous


def test_bfloat16_on_both_engines(server) -> None:
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    results = []
    for engine in ENGINES:
        with make_client(server.target, engine, timeout=60) as c:
            results.append(c.multiply(a, b, dtype="bfloat16"))
            results.append(c.multiply_streamed(a, b, dtype="bfloat16", chunk_bytes=10))
    for r in results:
        assert r.dtype == np.float32
        np.testing.assert_array_equal(r, results[0])


# --- errors and options ---------------------------------------------------------------


def test_errors_carry_the_grpc_code(client: Client, small_server) -> None:
    with pytest.raises(MatmulError) as mismatch:
        client.multiply(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    assert mismatch.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "inner dimensions" in mismatch.value.details()
    with pytest.raises(MatmulError) as batch:
        client.multiply_streamed(np.ones((2, 3, 3), np.float32), np.ones((4, 3, 3), np.float32))
    assert batch.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    engine = "native" if client.native else "pure"
    with make_client(small_server.target, engine, timeout=30) as small:
        with pytest.raises(MatmulError) as big:
            small.multiply(np.ones((200, 200), np.float32), np.ones((200, 200), np.float32))
        assert big.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_native_core_errors_are_grpc_rpc_errors(server) -> None:
    """The native core's failures (StatusError inside) reach the caller as
    grpc.RpcErrors with grpc's code() and details()."""
    with make_client(server.target, "native", timeout=60) as c:
        for call, code, details in (
            (lambda: c.multiply(np.ones((2, 3)), np.ones((4, 2))),
             grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions"),
            (lambda: c.multiply_streamed(np.ones((2, 3)), np.ones((4, 2)), stripes=2),
             grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions"),
            (lambda: c.multiply_async(np.ones((2, 3)), np.ones((4, 2))).result(timeout=_WAIT_S),
             grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions"),
            (lambda: c.download("h-no-such-handle"), grpc.StatusCode.NOT_FOUND, "h-no-such-handle"),
        ):
            try:
                call()
            except grpc.RpcError as error:
                assert error.code() is code, error
                assert details in error.details(), error
            else:
                pytest.fail(f"no error; expected {code.name}")


@pytest.mark.parametrize("engine", ENGINES)
def test_unreachable_is_unavailable(engine: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with make_client(f"127.0.0.1:{port}", engine, timeout=30) as nowhere:
        for call in (nowhere.multiply, nowhere.multiply_streamed):
            with pytest.raises(MatmulError) as raised:
                call(np.ones((2, 2)), np.ones((2, 2)))
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


def test_native_choice(server) -> None:
    from matmul_client import _client

    with Client(server.target, native=False) as pure:
        assert not pure.native
    with pytest.raises(TypeError):
        Client(server.target, native="yes")
    if _client.NATIVE_UNAVAILABLE is None:
        with Client(server.target) as default:
            assert default.native
        # Int and string options, and TLS (nothing connects until a call).
        options = [("grpc.max_receive_message_length", 1 << 20), ("grpc.primary_user_agent", "t")]
        with Client(server.target, options=options) as custom:
            assert custom.native
        with Client(server.target, tls=True) as secure:
            assert secure.native
    else:
        with pytest.raises(ValueError, match="native=True"):
            Client(server.target, native=True)


def test_closed_client_refuses(server) -> None:
    c = make_client(server.target, "native", timeout=30)
    c.close()
    assert not c.native
    with pytest.raises(ValueError):
        c.multiply(np.ones((2, 2)), np.ones((2, 2)))


# --- seen from the server: metadata, deadlines, the GIL --------------------------------


class RecordingServicer(matmul_pb2_grpc.MatmulServiceServicer):
    """Multiply: records the call, optionally waits at a barrier, answers A.B
    (float32, 2-D, no transposes)."""

    def __init__(self) -> None:
        self.calls: List[Tuple[dict, Optional[float]]] = []
        self.entered = threading.Semaphore(0)
        self.barrier: Optional[threading.Barrier] = None
        self.release: Optional[threading.Event] = None
        self.lock = threading.Lock()

    def Multiply(self, request, context):  # noqa: N802 - the RPC's name
        with self.lock:
            self.calls.append((dict(context.invocation_metadata()), context.time_remaining()))
        self.entered.release()
        if self.barrier is not None:
            self.barrier.wait(_WAIT_S)  # BrokenBarrierError fails the call
        if self.release is not None and not self.release.wait(_WAIT_S):
            context.abort(grpc.StatusCode.ABORTED, "the test never released the call")
        a = np.frombuffer(request.a.data, "<f4").reshape(tuple(request.a.shape))
        b = np.frombuffer(request.b.data, "<f4").reshape(tuple(request.b.shape))
        c = (a @ b).astype("<f4")
        return matmul_pb2.MultiplyResponse(
            c=matmul_pb2.Tensor(shape=c.shape, dtype=matmul_pb2.DTYPE_FLOAT32, data=c.tobytes())
        )


@pytest.fixture()
def recording() -> Iterator[Tuple[RecordingServicer, str]]:
    servicer = RecordingServicer()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
    matmul_pb2_grpc.add_MatmulServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(grace=None)


@pytest.mark.parametrize("engine", ENGINES)
def test_client_id_and_deadline_reach_the_server(recording, engine: str) -> None:
    servicer, target = recording
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((3, 2), np.float32)
    with make_client(target, engine, client_id="notebook-7", timeout=40) as c:
        np.testing.assert_array_equal(c.multiply(a, b), a @ b)
        np.testing.assert_array_equal(c.multiply(a, b, timeout=20), a @ b)
    with make_client(target, engine) as anonymous:
        np.testing.assert_array_equal(anonymous.multiply(a, b), a @ b)
    (meta1, left1), (meta2, left2), (meta3, left3) = servicer.calls
    assert meta1["x-matmul-client"] == meta2["x-matmul-client"] == "notebook-7"
    assert "x-matmul-client" not in meta3
    # grpc-timeout travels rounded up (to 100 ms units here), hence the + 1.
    assert 30 < left1 <= 41  # the client's default timeout
    assert 10 < left2 <= 21  # the call's own
    assert left3 is None or left3 > 1e6  # no deadline


def test_gil_is_released_during_a_native_call(recording) -> None:
    """The handler (Python, on a server thread) runs while the call is in
    flight, and so does this thread: the call's thread holds no GIL."""
    servicer, target = recording
    servicer.release = threading.Event()
    a, b = np.ones((4, 5), np.float32), np.ones((5, 3), np.float32)
    with make_client(target, "native", timeout=_WAIT_S) as c:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(c.multiply, a, b)
            # Only possible if the calling thread let go of the GIL.
            assert servicer.entered.acquire(timeout=_WAIT_S), "the server never saw the call"
            counted = 0
            for _ in range(10_000):  # Python bytecode on this thread meanwhile
                counted += 1
            assert not future.done() and counted == 10_000
            servicer.release.set()
            np.testing.assert_array_equal(future.result(timeout=_WAIT_S), a @ b)


def test_two_threads_calls_overlap(recording) -> None:
    """Both calls are in the server at once (a barrier of two), so neither
    thread held the GIL, or a lock of the client, for its whole call."""
    servicer, target = recording
    servicer.barrier = threading.Barrier(2)
    a, b = np.ones((4, 5), np.float32), np.ones((5, 3), np.float32)
    with make_client(target, "native", timeout=_WAIT_S) as c:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(c.multiply, a * (i + 1), b) for i in range(2)]
            for i, f in enumerate(futures):
                np.testing.assert_array_equal(f.result(timeout=2 * _WAIT_S), (a * (i + 1)) @ b)
    assert len(servicer.calls) == 2
