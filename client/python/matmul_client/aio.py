"""AsyncClient: the matmul client for asyncio programs (notebooks, services
that already run an event loop).

Same methods, arguments, results and errors as :class:`matmul_client.Client`,
as coroutines::

    async with matmul_client.aio.AsyncClient("127.0.0.1:50051") as client:
        c = await client.multiply(a, b)
        products = await asyncio.gather(*(client.multiply(x, b) for x in xs))

On the native core (``matmul_client._native``, where it imports) every call
is an asynchronous call of the C++ client library: nothing blocks the event
loop and no thread pool is involved. The library completes the call on one
of gRPC's threads, which takes the GIL only to hand the outcome to the loop
(``loop.call_soon_threadsafe``); operands go out from their own buffers, as
with :class:`Client`. :meth:`AsyncClient.multiply_streamed` runs the
library's blocking streamed call on a native thread of its own (not the
loop's executor), which ends with the call. Cancelling the awaiting task
cancels the RPC of every call (multiply, multiply_streamed, upload, download,
delete; the server sees CANCELLED): the task raises CancelledError at once,
and the native call ends promptly after it, leaving nothing blocked.
``server_info`` and ``health`` use a ``grpc.aio`` channel.

Without the native core (not built, MATMUL_CLIENT_NATIVE=0, native=False,
or channel options it cannot take) every call runs on ``grpc.aio`` (part of
grpcio), with the pure-Python client's encoding; cancelling the task
cancels the RPC there too.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Optional, Sequence, Tuple

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from ._channel import ChannelOption, TlsArgument, channel_options, tls_config
from ._routing import HandleRouter, handle_device, ip_target_authority, routed_error
from ._client import CLIENT_ID_METADATA_KEY, _check_client_id
from ._errors import MatmulError
from ._handles import Handle, HandleOrId, handle_id, ttl_seconds
from ._info import ServerInfo
from ._native_bridge import (
    _downloaded,
    _handle_from_native,
    _make_native,
    _native,
    _native_args,
    _native_array,
    _native_error,
    _native_status,
    _native_upload_args,
)
from ._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
from ._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc
from ._requests import Operand, _multiply_request
from ._stored_chunks import (
    DOWNLOAD_CHUNK_BYTES,
    DownloadAssembler,
    chunk_under,
    chunked,
    too_large,
    unimplemented_upload,
    upload_messages,
    upload_values,
)
from ._streamed import (
    _check_stripes,
    _stream_messages,
    _stream_plan,
    _StreamProduct,
    _wire_bytes,
)
from ._tensors import (
    DTYPE_NAMES,
    from_tensor,
    resolve_single_wire_type,
    stored_wire_type,
)

__all__ = ["AsyncClient"]


class AsyncClient:
    """A connection to a matmul server for asyncio.

    Arguments are those of :class:`matmul_client.Client`. Use it from one
    event loop (the first one that awaits it; the grpc.aio channel binds to
    it). ``async with`` closes it at the end of the block.

    Handles it returns are bound to it: ``await handle.download()`` and
    ``await handle.delete()`` work; ``with handle:`` does not (it would have
    to block), use ``await client.delete(handle)``.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: Optional[float] = None,
        tls: TlsArgument = None,
        options: Sequence[ChannelOption] = (),
        client_id: Optional[str] = None,
        native: Optional[bool] = None,
    ) -> None:
        if native is not None and not isinstance(native, bool):
            raise TypeError(f"native: expected None or a bool, got {type(native).__name__}")
        self._target = target
        self._tls = tls
        self._options = tuple(options)
        tls_config(tls)  # Raises for a malformed tls argument now.
        self._client_id = _check_client_id(client_id)
        self._metadata: Optional[Tuple[Tuple[str, str], ...]] = (
            ((CLIENT_ID_METADATA_KEY, self._client_id),) if self._client_id else None
        )
        self._timeout = timeout
        self._native: Any = None
        if native is not False:
            self._native, why = _make_native(target, tls, options, self._client_id)
            if self._native is None and native:
                raise ValueError(f"native=True, but {why}")
        self._in_flight = 0  # native calls whose outcome has not come back
        self._channel: Optional[grpc.aio.Channel] = None
        self._stub: Any = None
        self._health: Any = None
        # Calls naming a handle go to the server it names (_routing.py), on
        # grpc.aio channels made at first use, like the spread's.
        self._router = HandleRouter(
            target, channel_options(self._options, tls_config(tls)), self._home_channel,
            matmul_pb2_grpc.MatmulServiceStub,
        )

    @property
    def native(self) -> bool:
        """Whether calls run on the native core (else on grpc.aio)."""
        return self._native is not None

    @property
    def client_id(self) -> Optional[str]:
        """The "x-matmul-client" this client sends, or None."""
        return self._client_id

    async def multiply(
        self,
        a: Operand,
        b: Operand,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        compute: str = "strict",
        dtype: Any = None,
        timeout: Optional[float] = None,
        keep: bool = False,
        result_ttl: Optional[float] = None,
    ) -> Any:
        """:meth:`Client.multiply`, awaited. Cancelling the task cancels the
        RPC. The operands must not change until the call is done (they are
        sent from their own memory)."""
        deadline = self._deadline(timeout)
        if self._native is not None:
            args, wire = _native_args(
                a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl, deadline
            )
            native = self._native
            value = await self._await_native(lambda done: native.multiply_async(*args, done))
            if keep:
                return _handle_from_native(value, self)
            return _native_array(value, wire)
        request, wire = _multiply_request(
            a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl
        )
        home = self._router.home(request.a_handle, request.b_handle)
        stub = self._router.stub(home, self._pure()[0])
        try:
            response = await stub.Multiply(request, timeout=deadline, metadata=self._metadata)
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error
        if keep:
            if not response.HasField("c_handle"):
                raise MatmulError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    "the server returned the product instead of keeping it: it does not "
                    "support stored tensors",
                )
            return Handle.from_proto(response.c_handle, self)
        return from_tensor(response.c, wire)

    async def multiply_streamed(
        self,
        a: Operand,
        b: Operand,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        compute: str = "strict",
        dtype: Any = None,
        timeout: Optional[float] = None,
        chunk_bytes: Optional[int] = None,
        stripes: Optional[int] = None,
    ) -> np.ndarray:
        """:meth:`Client.multiply_streamed`, awaited. On the native core the
        library's (blocking, GIL-free) streamed call runs on a native thread
        of its own. Cancelling the task cancels the stream (on both cores);
        the operands must not change until the call is done. ``stripes`` > 1
        needs the native core (ValueError on grpc.aio); left at None, it is
        chosen from the size there and is 1 on grpc.aio."""
        chunk_bytes, stripes = _stream_plan(
            _wire_bytes(a, b, transpose_a, transpose_b), chunk_bytes, stripes, self._native is not None
        )
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes={chunk_bytes}: expected a positive size")
        stripes = _check_stripes(stripes)
        if stripes > 1 and self._native is None:
            raise ValueError(
                f"stripes={stripes}: striping needs the native core (matmul_client._native); "
                "the grpc.aio path sends one stream"
            )
        deadline = self._deadline(timeout)
        if self._native is not None:
            args, wire = _native_args(
                a, b, transpose_a, transpose_b, compute, dtype, False, None, deadline
            )
            native = self._native
            product = await self._await_native(
                lambda done: native.multiply_streamed_async(
                    *args[:11], int(chunk_bytes), done, stripes=stripes
                )
            )
            return _native_array(product, wire)
        request, wire = _multiply_request(a, b, transpose_a, transpose_b, compute, dtype)
        messages, step = _stream_messages(request, chunk_bytes)

        async def requests() -> AsyncIterator[matmul_pb2.MultiplyStreamRequest]:
            for message in messages:
                yield message

        home = self._router.home(request.a_handle, request.b_handle)
        stub = self._router.stub(home, self._pure()[0])
        product = _StreamProduct()
        try:
            async for response in stub.MultiplyStream(
                requests(), timeout=deadline, metadata=self._metadata
            ):
                product.add(response)
        except MatmulError as error:
            # The stream's own error, or a malformed product (an RpcError too).
            raise routed_error(error, home) from None
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error
        return product.result(wire)

    async def upload(
        self,
        array: npt.ArrayLike,
        *,
        device: Optional[int] = None,
        ttl: Optional[float] = None,
        dtype: Any = None,
        timeout: Optional[float] = None,
        near: Optional[HandleOrId] = None,
    ) -> Handle:
        """:meth:`Client.upload`, awaited (the array is copied before the
        first await). Cancelling the task cancels the RPC."""
        x = np.asarray(array)
        if x.ndim not in (2, 3):
            raise ValueError(
                f"array has {x.ndim} dimension(s) (shape {x.shape}); a stored tensor is "
                f"2-D [rows, cols] or 3-D [batch, rows, cols]"
            )
        if device is not None and (isinstance(device, bool) or not isinstance(device, (int, np.integer))):
            raise TypeError(f"device: expected None or a device index, got {type(device).__name__}")
        near_id = "" if near is None else handle_id(near)
        if device is None and near_id:
            device = handle_device(near_id)
        deadline = self._deadline(timeout)
        if self._native is not None:
            args = _native_upload_args(x, dtype, device, ttl, deadline, near_id)
            native = self._native
            value = await self._await_native(lambda done: native.upload_async(*args, done))
            return _handle_from_native(value, self)
        wire = resolve_single_wire_type(x, dtype, "array")
        values = upload_values(x, wire)
        ttl_s = ttl_seconds(ttl, "ttl")
        home = self._router.home(near_id)
        stub = self._router.stub(home, self._pure()[0])
        if chunked(values) and np.may_share_memory(values, x):
            values = values.copy()  # the caller may change x once we await
        smaller = False
        if not chunked(values):
            request = matmul_pb2.UploadRequest(
                tensor=matmul_pb2.Tensor(shape=values.shape, dtype=wire.proto, data=values.tobytes()),
                ttl_seconds=ttl_s,
            )
            if device is not None:
                request.device = int(device)
            try:
                response = await stub.Upload(request, timeout=deadline, metadata=self._metadata)
                return Handle.from_proto(response.handle, self)
            except grpc.RpcError as error:
                if not too_large(error):
                    raise routed_error(MatmulError.from_call(error), home) from error
                smaller = True  # over this server's message size
        # In chunks; under the server's message size (GetServerInfo) where
        # it refused the default ones as too large.
        chunk = None
        for attempt in range(2):
            try:
                if smaller:
                    info = await stub.GetServerInfo(
                        matmul_pb2.GetServerInfoRequest(), timeout=deadline, metadata=self._metadata
                    )
                    chunk = chunk_under(info.limits.max_message_bytes)
                response = await stub.UploadStream(
                    upload_messages(values, wire, device, ttl_s, chunk), timeout=deadline, metadata=self._metadata
                )
                return Handle.from_proto(response.handle, self)
            except grpc.RpcError as error:
                if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                    raise unimplemented_upload(error) from error
                if smaller or not too_large(error):
                    raise routed_error(MatmulError.from_call(error), home) from error
                smaller = True
        raise AssertionError("unreachable")

    async def download(self, handle: HandleOrId, *, timeout: Optional[float] = None) -> np.ndarray:
        """:meth:`Client.download`, awaited. Cancelling the task cancels the
        RPC."""
        ident = handle_id(handle)
        deadline = self._deadline(timeout)
        if self._native is not None:
            native = self._native
            seconds = None if deadline is None else float(deadline)
            value = await self._await_native(lambda done: native.download_async(ident, seconds, done))
            return _downloaded(value)
        home = self._router.home(ident)
        stub = self._router.stub(home, self._pure()[0])
        assembler = DownloadAssembler()
        call = stub.DownloadStream(
            matmul_pb2.DownloadStreamRequest(handle=ident, chunk_bytes=DOWNLOAD_CHUNK_BYTES),
            timeout=deadline,
            metadata=self._metadata,
        )
        try:
            async for response in call:
                assembler.add(response)
            return assembler.result()
        except MatmulError:
            call.cancel()
            raise
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.UNIMPLEMENTED or assembler.started:
                raise routed_error(MatmulError.from_call(error), home) from error
        except BaseException:  # Interrupted (KeyboardInterrupt, a cancelled task).
            call.cancel()
            raise
        # A server without DownloadStream: in one message.
        try:
            response = await stub.Download(
                matmul_pb2.DownloadRequest(handle=ident), timeout=deadline, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error
        tensor = response.tensor
        name = DTYPE_NAMES.get(tensor.dtype)
        if name is None:
            raise MatmulError(grpc.StatusCode.INTERNAL, f"the server sent a tensor of unknown dtype {tensor.dtype}")
        return from_tensor(tensor, stored_wire_type(name))

    async def delete(self, handle: HandleOrId, *, timeout: Optional[float] = None) -> None:
        """:meth:`Client.delete`, awaited. Cancelling the task cancels the
        RPC (the tensor may or may not be deleted then)."""
        ident = handle_id(handle)
        deadline = self._deadline(timeout)
        if self._native is not None:
            native = self._native
            seconds = None if deadline is None else float(deadline)
            await self._await_native(lambda done: native.delete_async(ident, seconds, done))
            return
        home = self._router.home(ident)
        stub = self._router.stub(home, self._pure()[0])
        try:
            await stub.Delete(
                matmul_pb2.DeleteRequest(handle=ident), timeout=deadline, metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error

    async def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """:meth:`Client.server_info`, awaited (over grpc.aio)."""
        stub = self._pure()[0]
        try:
            response = await stub.GetServerInfo(
                matmul_pb2.GetServerInfoRequest(),
                timeout=self._deadline(timeout),
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        return ServerInfo.from_proto(response)

    async def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """:meth:`Client.health`, awaited (over grpc.aio)."""
        health = self._pure()[1]
        try:
            response = await health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._deadline(timeout)
            )
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def wait_for_connected(self, timeout: Optional[float] = None) -> None:
        """:meth:`Client.wait_for_connected`, awaited: the grpc.aio channel
        (made now where there is no native core) with ``channel_ready()``,
        and the native core's channels on the loop's default executor, in
        slices of at most 0.1 s, so that cancelling the awaiting task leaves
        no thread waiting for long.

        Raises:
            MatmulError: DEADLINE_EXCEEDED when the timeout passes first.
        """
        limit = self._deadline(timeout)
        loop = asyncio.get_running_loop()
        end = None if limit is None else loop.time() + limit

        def remaining() -> Optional[float]:
            return None if end is None else max(0.0, end - loop.time())

        def timed_out() -> MatmulError:
            return MatmulError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"client: not connected after {limit} s"
            )

        if self._native is None or self._channel is not None:
            self._pure()
            assert self._channel is not None
            try:
                await asyncio.wait_for(self._channel.channel_ready(), remaining())
            except asyncio.TimeoutError:
                raise timed_out() from None
        native = self._native
        if native is None:
            return
        while True:
            left = remaining()
            step = 0.1 if left is None else min(0.1, left)
            try:
                await loop.run_in_executor(None, native.wait_for_connected, step)
                return
            except _native.StatusError as error:
                failure = _native_error(error)
                if failure.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise failure from None
            if left is not None and left <= step:
                raise timed_out()

    async def close(self) -> None:
        """Closes the client. Native calls in flight finish first (each
        holds the native client); grpc.aio calls in flight are cancelled."""
        self._native = None
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
        for home in self._router.take_channels():
            await home.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _await_native(self, start: Callable[[Callable[[bool, Any], None]], Any]) -> Any:
        """Starts a native asynchronous call with ``start(done)`` and awaits
        its outcome. ``done(ok, value)`` runs on a gRPC (or the call's own)
        thread, with the GIL taken for it alone, and only schedules the
        outcome on this loop. Cancelling the awaiting task cancels the call
        (``call.cancel()``) and raises at once; the call's outcome still
        comes back later (``_in_flight`` counts the calls it has not)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def resolve(ok: bool, value: Any) -> None:  # On the loop's thread.
            self._in_flight -= 1
            if future.done():
                return  # Cancelled meanwhile.
            if ok:
                future.set_result(value)
            else:
                future.set_exception(_native_status(*value))

        def done(ok: bool, value: Any) -> None:  # On a native thread.
            try:
                loop.call_soon_threadsafe(resolve, ok, value)
            except RuntimeError:
                pass  # The loop is closed: nobody awaits the result any more.

        call = start(done)
        self._in_flight += 1
        try:
            return await future
        except asyncio.CancelledError:
            call.cancel()
            raise

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout

    def _home_channel(self, address: str) -> grpc.aio.Channel:
        """A grpc.aio channel to the one server at ``address`` (a handle's),
        with the target's settings; under TLS it checks the certificate
        against the target's name, as the spread does."""
        config = tls_config(self._tls)
        merged = channel_options(self._options, config)
        if config is None:
            return grpc.aio.insecure_channel(address, options=merged)
        authority = ip_target_authority(self._target)
        if authority:
            merged.append(("grpc.default_authority", authority))
        return grpc.aio.secure_channel(address, config.credentials(), options=merged)

    def _pure(self) -> Tuple[Any, Any]:
        """The grpc.aio stubs, on a channel made at first use (inside the loop)."""
        if self._channel is None:
            config = tls_config(self._tls)
            merged = channel_options(self._options, config)
            if config is None:
                self._channel = grpc.aio.insecure_channel(self._target, options=merged)
            else:
                self._channel = grpc.aio.secure_channel(
                    self._target, config.credentials(), options=merged
                )
            self._stub = matmul_pb2_grpc.MatmulServiceStub(self._channel)
            self._health = health_pb2_grpc.HealthStub(self._channel)
        return self._stub, self._health

