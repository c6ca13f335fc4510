"""matmul_client.aio.AsyncClient: products against NumPy, many concurrent
awaits on one event loop, stored tensors, errors with their gRPC codes,
deadlines and cancellation, on both engines (the native core's asynchronous
calls, and grpc.aio).

Deadlines and cancellation are seen from the server's side: a small Python
gRPC server in this process (``HoldingServicer``) holds each call
(Multiply, MultiplyStream, Upload, Download, Delete) until the test lets it
go, and records when the RPC ended; a cancelled call ends while its handler
is still holding it, which only a cancellation can do. A big streamed
multiply cancelled mid-flight on a real server shows there as a
MultiplyStream multiply ended CANCELLED (its /metrics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import threading
import urllib.request
from typing import Any, Callable, Iterator, List, Tuple

import grpc
import numpy as np
import pytest

from conftest import ENGINES, ServerProcess, _free_port
from matmul_client import MatmulError
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc
from matmul_client.aio import AsyncClient

_WAIT_S = 30  # bound on every wait; never reached when passing
# The deadline of calls that a test cancels: past every wait of the test, so
# that only a cancellation can end them while it waits.
_CANCELLED_CALL_TIMEOUT_S = 3 * _WAIT_S


def make_async_client(target: str, engine: str, **kwargs: Any) -> AsyncClient:
    """An AsyncClient on ``engine`` ("native" or "pure"); skips the test when
    the native core cannot be had."""
    if engine == "native":
        from matmul_client import _client

        if _client.NATIVE_UNAVAILABLE is not None:
            pytest.skip(f"native engine: {_client.NATIVE_UNAVAILABLE}")
    c = AsyncClient(target, native=engine == "native", **kwargs)
    assert c.native == (engine == "native")
    return c


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 4 * _WAIT_S))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_matches_numpy(server, engine: str, dtype: str) -> None:
    rng = np.random.default_rng(21)
    a = rng.integers(-4, 5, (3, 17, 29)).astype(dtype)  # small integers: exact
    b = rng.integers(-4, 5, (29, 11)).astype(dtype)

    async def main() -> None:
        async with make_async_client(server.target, engine, timeout=60) as c:
            got = await c.multiply(a, b)
            assert got.dtype == np.dtype(dtype) and got.shape == (3, 17, 11)
            np.testing.assert_array_equal(got, a.astype(np.float64) @ b.astype(np.float64))
            got_t = await c.multiply(a, b.T.copy(), transpose_b=True)
            np.testing.assert_array_equal(got_t, got)
            streamed = await c.multiply_streamed(a, b, chunk_bytes=256)
            np.testing.assert_array_equal(streamed, got)
            # Striped over three calls on the native core; grpc.aio refuses it.
            if c.native:
                striped = await c.multiply_streamed(a, b, chunk_bytes=256, stripes=3)
                np.testing.assert_array_equal(striped, got)
            else:
                with pytest.raises(ValueError, match="stripes=3: striping needs the native core"):
                    await c.multiply_streamed(a, b, stripes=3)

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_many_concurrent_awaits_on_one_loop(server, engine: str) -> None:
    rng = np.random.default_rng(22)
    cases = [
        (rng.standard_normal((i % 13 + 1, 7)), rng.standard_normal((7, i % 5 + 1)))
        for i in range(200)
    ]

    async def main() -> List[np.ndarray]:
        async with make_async_client(server.target, engine, timeout=60) as c:
            return await asyncio.gather(*(c.multiply(a, b) for a, b in cases))

    results = run(main())
    assert len(results) == len(cases)
    for (a, b), got in zip(cases, results):
        np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_stored_tensors(server, engine: str) -> None:
    rng = np.random.default_rng(23)
    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)

    async def main() -> None:
        async with make_async_client(server.target, engine, timeout=60) as c:
            ha = await c.upload(a, ttl=60)
            assert ha.shape == (6, 5) and ha.dtype == "float32" and ha.bytes == a.nbytes
            np.testing.assert_array_equal(await c.download(ha), a)
            np.testing.assert_array_equal(await ha.download(), a)
            hab = await c.multiply(ha, b, keep=True, result_ttl=30)
            assert hab.shape == (6, 4) and hab.dtype == "float32"
            expected = await c.multiply(a, b)
            np.testing.assert_array_equal(await c.download(hab.id), expected)
            np.testing.assert_array_equal(await c.multiply(hab, np.eye(4, dtype=np.float32)), expected)
            await c.delete(ha)
            await hab.delete()
            for gone in (ha, hab):
                with pytest.raises(MatmulError) as raised:
                    await c.download(gone)
                assert raised.value.code() is grpc.StatusCode.NOT_FOUND
            with pytest.raises(MatmulError) as raised:
                await c.delete(ha)
            assert raised.value.code() is grpc.StatusCode.NOT_FOUND

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_errors_carry_the_grpc_code(server, small_server, engine: str) -> None:
    async def main() -> None:
        async with make_async_client(server.target, engine, timeout=60) as c:
            with pytest.raises(MatmulError) as raised:
                await c.multiply(np.ones((3, 4)), np.ones((5, 6)))
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(MatmulError) as raised:
                await c.multiply(np.ones((2, 2)), np.ones((2, 3)), transpose_b=True)
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(MatmulError) as raised:
                await c.multiply_streamed(np.ones((3, 4)), np.ones((5, 6)))
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(MatmulError) as raised:
                await c.download("h-no-such-handle")
            assert raised.value.code() is grpc.StatusCode.NOT_FOUND
            # Arguments that could never be sent raise before any await.
            with pytest.raises(ValueError):
                await c.multiply(np.ones(3), np.ones((3, 3)))
            with pytest.raises(TypeError):
                await c.multiply(np.ones((2, 2), np.float32), np.ones((2, 2)))
            assert await c.health() == "SERVING"
            assert (await c.server_info()).engine
        async with make_async_client(small_server.target, engine, timeout=60) as small:
            with pytest.raises(MatmulError) as raised:
                await small.multiply(np.ones((200, 1)), np.ones((1, 200)))
            assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        async with make_async_client(f"127.0.0.1:{_free_port()}", engine, timeout=30) as nowhere:
            with pytest.raises(MatmulError) as raised:
                await nowhere.multiply(np.ones((2, 2)), np.ones((2, 2)))
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_errors_are_grpc_rpc_errors(server, engine: str) -> None:
    """Code written for grpc.aio (``except grpc.RpcError``, then grpc's
    ``code()`` and ``details()``) handles AsyncClient's errors."""
    mismatched = (np.ones((3, 4)), np.ones((5, 6)))

    async def main() -> None:
        async with make_async_client(server.target, engine, timeout=60) as c:
            for call, code, details in (
                (lambda: c.multiply(*mismatched), grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions differ"),
                (lambda: c.multiply_streamed(*mismatched, chunk_bytes=64),
                 grpc.StatusCode.INVALID_ARGUMENT, "inner dimensions differ"),
                (lambda: c.download("h-no-such-handle"), grpc.StatusCode.NOT_FOUND, "h-no-such-handle"),
            ):
                try:
                    await call()
                except grpc.RpcError as error:
                    assert error.code() is code, error
                    assert type(error.details()) is str and details in error.details(), error
                else:
                    pytest.fail(f"no error; expected {code.name}")

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_wait_for_connected(server, engine: str) -> None:
    async def main() -> None:
        async with make_async_client(server.target, engine) as c:
            await c.wait_for_connected(timeout=_WAIT_S)
            a = np.arange(6, dtype=np.float32).reshape(2, 3)
            np.testing.assert_array_equal(await c.multiply(a, a.T), a @ a.T)
        async with make_async_client(f"127.0.0.1:{_free_port()}", engine) as nowhere:
            started = asyncio.get_running_loop().time()
            with pytest.raises(MatmulError) as raised:
                await nowhere.wait_for_connected(timeout=0.3)
            waited = asyncio.get_running_loop().time() - started
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, raised.value
            assert 0.25 <= waited < 10, waited

    run(main())


# --- deadlines and cancellation, seen from the server -----------------------------


class HoldingServicer(matmul_pb2_grpc.MatmulServiceServicer):
    """Holds each call (once it has its whole request) until ``release`` is
    set, recording that it entered and, through the RPC's termination
    callback, whether it ended while still held (cancelled or past its
    deadline); then answers: Multiply A.B, Upload a handle, Download a 2x2
    tensor, Delete nothing; MultiplyStream fails UNIMPLEMENTED."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.ended_while_held = threading.Semaphore(0)
        self.release = threading.Event()

    def _hold(self, context: grpc.ServicerContext) -> None:
        held = threading.Event()
        held.set()

        def on_termination() -> None:
            if held.is_set() and not self.release.is_set():
                self.ended_while_held.release()

        context.add_callback(on_termination)
        self.entered.release()
        self.release.wait(_WAIT_S)
        held.clear()

    def Upload(self, request, context):  # noqa: N802 - the RPC's name
        self._hold(context)
        return matmul_pb2.UploadResponse(
            handle=matmul_pb2.TensorHandle(
                id="h-held", shape=request.tensor.shape, dtype=request.tensor.dtype,
                device=-1, bytes=len(request.tensor.data),
            )
        )

    def Download(self, request, context):  # noqa: N802 - the RPC's name
        self._hold(context)
        data = np.zeros((2, 2), "<f4")
        return matmul_pb2.DownloadResponse(
            tensor=matmul_pb2.Tensor(shape=data.shape, dtype=matmul_pb2.DTYPE_FLOAT32, data=data.tobytes())
        )

    def Delete(self, request, context):  # noqa: N802 - the RPC's name
        self._hold(context)
        return matmul_pb2.DeleteResponse()

    def MultiplyStream(self, request_iterator, context):  # noqa: N802 - the RPC's name
        for _ in request_iterator:  # until the client's last chunk
            pass
        self._hold(context)
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "the holding server computes no streams")
        yield matmul_pb2.MultiplyStreamResponse()  # never reached: a generator

    def Multiply(self, request, context):  # noqa: N802 - the RPC's name
        self._hold(context)
        a = np.frombuffer(request.a.data, "<f4").reshape(tuple(request.a.shape))
        b = np.frombuffer(request.b.data, "<f4").reshape(tuple(request.b.shape))
        c = (a @ b).astype("<f4")
        return matmul_pb2.MultiplyResponse(
            c=matmul_pb2.Tensor(shape=c.shape, dtype=matmul_pb2.DTYPE_FLOAT32, data=c.tobytes())
        )


@pytest.fixture()
def holding() -> Iterator[Tuple[HoldingServicer, str]]:
    servicer = HoldingServicer()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    matmul_pb2_grpc.add_MatmulServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.release.set()
    server.stop(grace=None)


_A = np.arange(6, dtype=np.float32).reshape(2, 3)
_B = np.ones((3, 2), np.float32)


@pytest.mark.parametrize("engine", ENGINES)
def test_deadline_exceeded(holding, engine: str) -> None:
    servicer, target = holding

    async def main() -> None:
        async with make_async_client(target, engine) as c:
            with pytest.raises(MatmulError) as raised:
                await c.multiply(_A, _B, timeout=0.2)
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        async with make_async_client(target, engine, timeout=0.2) as hasty:
            with pytest.raises(MatmulError) as raised:
                await hasty.multiply(_A, _B)  # the client's default timeout
            assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    run(main())
    assert servicer.entered.acquire(timeout=_WAIT_S)


@pytest.mark.parametrize("engine", ENGINES)
def test_cancelling_the_task_cancels_the_rpc(holding, engine: str) -> None:
    servicer, target = holding

    async def main() -> None:
        async with make_async_client(target, engine, timeout=_CANCELLED_CALL_TIMEOUT_S) as c:
            task = asyncio.ensure_future(c.multiply(_A, _B))
            loop = asyncio.get_running_loop()
            entered = await loop.run_in_executor(None, servicer.entered.acquire, True, _WAIT_S)
            assert entered, "the server never saw the call"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The RPC ended while the handler still held it: cancelled.
            ended = await loop.run_in_executor(None, servicer.ended_while_held.acquire, True, _WAIT_S)
            assert ended, "the server's call did not end: the RPC was not cancelled"
            servicer.release.set()
            # The client works on after a cancellation.
            np.testing.assert_array_equal(await c.multiply(_A, _B), _A @ _B)

    run(main())


async def _settled(c: AsyncClient) -> None:
    """Waits (bounded) until every native call of ``c`` has handed back its
    outcome: a cancelled call's thread, or gRPC's, is done with it."""
    for _ in range(_WAIT_S * 100):
        if c._in_flight == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{c._in_flight} native call(s) never came back")


async def _cancel_while_held(
    c: AsyncClient, servicer: HoldingServicer, call: Callable[[], Any]
) -> None:
    """Starts ``call()`` as a task, cancels it while the server holds it,
    and checks that the task raised CancelledError, the server's RPC ended
    while still held (cancelled, not answered) and the native call ended."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(call())
    entered = await loop.run_in_executor(None, servicer.entered.acquire, True, _WAIT_S)
    assert entered, "the server never saw the call"
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ended = await loop.run_in_executor(None, servicer.ended_while_held.acquire, True, _WAIT_S)
    assert ended, "the server's call did not end: the RPC was not cancelled"
    await _settled(c)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("method", ["multiply_streamed", "upload", "download", "delete"])
def test_cancelling_any_call_cancels_its_rpc(holding, engine: str, method: str) -> None:
    servicer, target = holding
    calls = {
        "multiply_streamed": lambda c: c.multiply_streamed(_A, _B, chunk_bytes=8),
        "upload": lambda c: c.upload(_A, ttl=60),
        "download": lambda c: c.download("h-held"),
        "delete": lambda c: c.delete("h-held"),
    }

    async def main() -> None:
        async with make_async_client(target, engine, timeout=_CANCELLED_CALL_TIMEOUT_S) as c:
            await _cancel_while_held(c, servicer, lambda: calls[method](c))
            # A second one, with nothing left of the first.
            await _cancel_while_held(c, servicer, lambda: calls[method](c))
            servicer.release.set()
            # The client works on after the cancellations.
            if method == "upload":
                assert (await c.upload(_A, ttl=60)).id == "h-held"
            elif method == "download":
                np.testing.assert_array_equal(await c.download("h-held"), np.zeros((2, 2)))
            elif method == "delete":
                await c.delete("h-held")
            else:
                with pytest.raises(MatmulError) as raised:
                    await c.multiply_streamed(_A, _B)
                assert raised.value.code() is grpc.StatusCode.UNIMPLEMENTED
            np.testing.assert_array_equal(await c.multiply(_A, _B), _A @ _B)

    run(main())


# --- a big streamed multiply cancelled mid-flight on a real server ----------------


@pytest.fixture(scope="module")
def metrics_server() -> Iterator[ServerProcess]:
    """A matmul-server of this module's own, with /metrics."""
    server = ServerProcess(metrics=True)
    yield server
    assert server.stop() == 0, server.output()


def _series(server: ServerProcess, name: str, **labels: str) -> float:
    """The value of one series of ``name`` with exactly ``labels`` on the
    server's /metrics; 0 when it is not there yet."""
    assert server.metrics_port is not None
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(url, timeout=5) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or "")) == labels:
            return float(match.group(2))
    return 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_cancelling_a_big_streamed_multiply_stops_it_on_the_server(metrics_server, engine: str) -> None:
    server = metrics_server
    n = 3072  # 36 MiB operands in 256 KiB chunks; a GEMM of seconds on the host engine
    a = np.ones((n, n), np.float32)
    b = np.ones((n, n), np.float32)
    small = np.arange(12, dtype=np.float32).reshape(3, 4)

    def read(name: str, **labels: str) -> float:
        return _series(server, name, **labels)

    def unanswered() -> float:
        # A multiply of a stream the client cancels ends CANCELLED, also
        # when the server's failed read comes before its OnCancel (it used
        # to count INVALID_ARGUMENT then, "the client closed the stream
        # before ...", in 6 of 8 runs).
        return sum(
            read("matmul_requests_total", method="MultiplyStream", code=code)
            for code in ("CANCELLED",)
        )

    def finished_ok() -> float:
        return read("matmul_requests_total", method="MultiplyStream", code="OK")

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def metric(get: Callable[[], float]) -> float:
            return await loop.run_in_executor(None, get)  # HTTP: off the loop

        async def until(get: Callable[[], float], predicate: Callable[[float], bool], what: str) -> float:
            for _ in range(_WAIT_S * 50):
                value = await metric(get)
                if predicate(value):
                    return value
                await asyncio.sleep(0.02)
            raise AssertionError(f"{what}: still {value}")

        async with make_async_client(server.target, engine, timeout=4 * _WAIT_S) as c:
            unanswered_before = await metric(unanswered)
            ok_before = await metric(finished_ok)
            in_before = await metric(lambda: read("matmul_payload_bytes_total", path="stream", direction="in"))
            task = asyncio.ensure_future(c.multiply_streamed(a, b, chunk_bytes=256 << 10))
            # Mid-flight: the server has operand chunks of it.
            await until(
                lambda: read("matmul_payload_bytes_total", path="stream", direction="in"),
                lambda v: v > in_before, "no operand chunk reached the server",
            )
            # The loop is free meanwhile: another call runs to its end.
            np.testing.assert_array_equal(await c.multiply(small, small.T.copy()), small @ small.T)
            assert not task.done(), "the big multiply ended before it was cancelled"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The server saw the stream's multiply end unanswered.
            await until(unanswered, lambda v: v == unanswered_before + 1, "no unanswered MultiplyStream")
            await _settled(c)  # the native call's thread is done
            await until(lambda: read("matmul_inflight_requests"), lambda v: v == 0, "requests in flight")
            assert await metric(finished_ok) == ok_before
            # The client and the server work on.
            got = await c.multiply_streamed(small, small.T.copy(), chunk_bytes=16)
            np.testing.assert_array_equal(got, small @ small.T)
            assert await metric(finished_ok) == ok_before + 1

    run(main())


@pytest.mark.parametrize("engine", ENGINES)
def test_calls_overlap_on_one_loop(holding, engine: str) -> None:
    """Eight calls are in the server at once, from one thread: none of them
    blocks the loop."""
    servicer, target = holding

    async def main() -> None:
        async with make_async_client(target, engine, timeout=_WAIT_S) as c:
            tasks = [asyncio.ensure_future(c.multiply(_A * i, _B)) for i in range(8)]
            loop = asyncio.get_running_loop()
            for _ in range(8):
                assert await loop.run_in_executor(None, servicer.entered.acquire, True, _WAIT_S)
            assert not any(t.done() for t in tasks)
            servicer.release.set()
            for i, got in enumerate(await asyncio.gather(*tasks)):
                np.testing.assert_array_equal(got, (_A * i) @ _B)

    run(main())


def test_native_calls_outlive_the_client_object(server) -> None:
    """A native call keeps the library's client alive: closing the
    AsyncClient, and dropping it, while calls are in flight is safe."""
    rng = np.random.default_rng(24)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))

    async def main() -> None:
        c = make_async_client(server.target, "native", timeout=60)
        tasks = [asyncio.ensure_future(c.multiply(a, b)) for _ in range(16)]
        await asyncio.sleep(0)  # let the calls start
        await c.close()
        del c
        for got in await asyncio.gather(*tasks):
            np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)

    run(main())


def test_native_choice(server) -> None:
    from matmul_client import _client

    assert not AsyncClient(server.target, native=False).native
    with pytest.raises(TypeError):
        AsyncClient(server.target, native="yes")
    if _client.NATIVE_UNAVAILABLE is None:
        assert AsyncClient(server.target).native
        assert AsyncClient(server.target, tls=True).native
        assert AsyncClient(server.target, options=[("grpc.primary_user_agent", "t")]).native
    else:
        with pytest.raises(ValueError, match="native=True"):
            AsyncClient(server.target, native=True)
