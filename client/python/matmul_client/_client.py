"""Client: NumPy matrix products computed by a remote matmul server.

The class and its methods, on either engine. What they share with
:class:`~matmul_client.aio.AsyncClient` lives beside this module: the
arguments checked and encoded in ``_requests``, the pure-Python streamed
multiply in ``_streamed``, the native core's loading and conversions in
``_native_bridge``.
"""

from __future__ import annotations

import concurrent.futures
import random
import threading
import time
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union, overload

import grpc
import numpy as np
import numpy.typing as npt

from ._channel import (
    ChannelOption,
    TlsArgument,
    channel_options,
    first_unconnected,
    make_channel,
    remaining_seconds,
    tls_config,
)
from .cuda_memory import CudaMemory, uses_gpu_memory
from ._errors import MatmulError
from ._routing import HandleRouter, handle_device, ip_target_authority, routed_error, target_addresses
from ._handles import Handle, HandleOrId, handle_id, ttl_seconds
from ._info import ServerInfo
# NATIVE_ENV and NATIVE_UNAVAILABLE are read as _client's too (bench.py, the
# tests, native/device-bench.sh).
from ._native_bridge import (
    NATIVE_ENV,
    NATIVE_UNAVAILABLE,
    _downloaded,
    _float_or_none,
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
    _multiply_stream,
    _multiply_striped,
    _stream_plan,
    _wire_bytes,
)
from ._tensors import (
    DTYPE_NAMES,
    WireType,
    from_tensor,
    resolve_single_wire_type,
    stored_wire_type,
)

__all__ = ["CLIENT_ID_METADATA_KEY", "NATIVE_ENV", "NATIVE_UNAVAILABLE", "Client"]

#: The metadata key naming the client the server charges stored tensors to.
CLIENT_ID_METADATA_KEY = "x-matmul-client"
_MAX_CLIENT_ID_LENGTH = 256
#: How many servers' striped connections a client keeps (the C++ library's
#: kMaxPinnedServers).
_MAX_PINNED_SERVERS = 16


def _check_client_id(client_id: Optional[str]) -> Optional[str]:
    if client_id is None:
        return None
    if not isinstance(client_id, str):
        raise TypeError(f"client_id: expected a string, got {type(client_id).__name__}")
    if not client_id or len(client_id) > _MAX_CLIENT_ID_LENGTH or not all(
        " " <= ch <= "~" for ch in client_id
    ):
        raise ValueError(
            f"client_id={client_id!r}: expected 1 to {_MAX_CLIENT_ID_LENGTH} printable ASCII "
            f"characters (it travels as gRPC metadata)"
        )
    return client_id


class Client:
    """A connection to a matmul server.

    Thread-safe: share one Client between threads. Closing it (or leaving a
    ``with`` block) closes the channel.

    Args:
        target: "host:port", "dns:///name:port" (every address the name
            resolves to, used round-robin), "unix:/path", ...
        timeout: Default deadline of each call, in seconds; None for none.
        tls: None or False for plaintext; True for TLS with gRPC's default
            roots; a :class:`TlsConfig` (or a mapping of its fields) for
            custom roots and mutual TLS.
        options: gRPC channel options, overriding the defaults of the same
            key (see ``matmul_client.DEFAULT_OPTIONS``).
        client_id: Sent as "x-matmul-client" metadata on every call: the
            name the server charges stored tensors (uploads, kept products)
            to. None: the server charges this machine's address. Printable
            ASCII, at most 256 characters.
        native: Whether :meth:`multiply` and :meth:`multiply_streamed` of
            arrays run on the native core (``matmul_client._native``, over
            the C++ client library: operands sent from their own buffers,
            the GIL released for the whole call), and so do stored
            tensors (upload, download, delete, handles as operands,
            keep=True) and multiply_async. None: where it imports (not with
            MATMUL_CLIENT_NATIVE=0) and every channel option is an int or a
            string; health and server_info stay on the pure-Python gRPC
            channel. True: required (ValueError where it cannot be used).
            False: pure Python only.

    Stored tensors: :meth:`upload` keeps an array on the server and returns a
    :class:`Handle`, which :meth:`multiply` takes in place of an array;
    ``multiply(..., keep=True)`` leaves the product on the server and returns
    its Handle, so products can be chained without crossing the network.
    :meth:`download` fetches a stored tensor, :meth:`delete` frees it (a
    Handle used as a context manager is deleted at the end of the block);
    unless deleted, it expires after its TTL.
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
        self._client_id = _check_client_id(client_id)
        self._metadata: Optional[Tuple[Tuple[str, str], ...]] = (
            ((CLIENT_ID_METADATA_KEY, self._client_id),) if self._client_id else None
        )
        self._timeout = timeout
        self._channel = make_channel(target, tls, options)
        self._stub = matmul_pb2_grpc.MatmulServiceStub(self._channel)
        self._channel_args = (target, tls, tuple(options))
        # Calls naming a handle go to the server it names (_routing.py).
        self._router = HandleRouter(
            target, channel_options(options, tls_config(tls)), self._home_channel,
            matmul_pb2_grpc.MatmulServiceStub,
        )
        self._stripe_lock = threading.Lock()
        self._stripe_channels: List[grpc.Channel] = []
        # When the client spreads: striped multiplies' channels to the one
        # server each went to, by its address, oldest first; the index of
        # the address the last one went to.
        self._pinned_stripes: Dict[str, List[grpc.Channel]] = {}
        self._next_pinned = random.randrange(1 << 30)
        self._cuda_memory: Any = None  # cuda_memory.CudaMemory, on first use
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._native: Any = None
        if native is not False:
            self._native, why = _make_native(target, tls, options, self._client_id)
            if self._native is None and native:
                raise ValueError(f"native=True, but {why}")

    @property
    def native(self) -> bool:
        """Whether :meth:`multiply` and :meth:`multiply_streamed` run on the
        native core (``matmul_client._native``, over the C++ client library)
        for operands that are arrays; False on the pure-Python path."""
        return self._native is not None

    @property
    def client_id(self) -> Optional[str]:
        """The "x-matmul-client" this client sends, or None."""
        return self._client_id

    @overload
    def multiply(
        self,
        a: Operand,
        b: Operand,
        *,
        transpose_a: bool = ...,
        transpose_b: bool = ...,
        compute: str = ...,
        dtype: Any = ...,
        timeout: Optional[float] = ...,
        keep: Literal[False] = ...,
        result_ttl: None = ...,
        out: Any = ...,
    ) -> Any: ...

    @overload
    def multiply(
        self,
        a: Operand,
        b: Operand,
        *,
        transpose_a: bool = ...,
        transpose_b: bool = ...,
        compute: str = ...,
        dtype: Any = ...,
        timeout: Optional[float] = ...,
        keep: Literal[True],
        result_ttl: Optional[float] = ...,
    ) -> Handle: ...

    def multiply(
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
        out: Any = None,
    ) -> Any:
        """Returns ``numpy.matmul(op(a), op(b))``, computed by the server.

        op(x) is x, or x with its last two axes swapped when transpose_x is
        set. Operands are 2-D [rows, cols] or 3-D [batch, rows, cols]; a 2-D
        operand against a 3-D one, or a batch of 1, is broadcast over the
        batch. The result is [m, n], or [batch, m, n] if either operand is 3-D.

        Args:
            a: Left operand: any array-like (any memory layout or byte
                order), or a :class:`Handle` of a stored tensor.
            b: Right operand, likewise.
            transpose_a: Use a with its last two axes swapped.
            transpose_b: Use b with its last two axes swapped.
            compute: "strict" (full precision of the dtype) or "tf32" (the
                server may use TF32 tensor cores for float32).
            dtype: None: both operands must already have the same dtype,
                float32, float64, float16 (or ml_dtypes.bfloat16), and the
                result has it too. "bfloat16": operands are rounded to
                bfloat16 (nearest even) and the result is float32 (holding
                bfloat16 values exactly). A NumPy dtype: both operands are
                converted to it first. A stored operand keeps its dtype: an
                array beside it must have that dtype (or be converted to it
                with dtype=...); a product of two stored bfloat16 tensors is
                returned as float32.
            timeout: Deadline in seconds; None for the client's default.
            keep: Leave the product on the server and return its
                :class:`Handle` instead of the array.
            result_ttl: With keep: how long the product lives unless deleted,
                in seconds (rounded up); None for the server's default.
            out: With GPU operands only: a GPU array (C-contiguous, the
                product's shape and the operands' dtype) the server writes
                the product into, returned.

        GPU arrays (``__cuda_array_interface__``, or ``__dlpack__`` on a
        CUDA device: PyTorch, CuPy, JAX) are taken as they are when the
        client is on the server's node (a ``unix:`` target, the server on
        the CUDA engine): their allocations are registered with the server
        once (``RegisterCudaMemory``, see :mod:`matmul_client.cuda_memory`)
        and the server's GPU reads the operands and writes the product in
        place, with no host copy. The product is then ``out``, a new tensor
        of the input's library where it has ``new_empty`` (a PyTorch tensor
        on the same GPU), or a :class:`~matmul_client.cuda_memory.DeviceBuffer`
        (``__cuda_array_interface__``) the client allocated. ``dtype`` and
        ``keep`` are not taken with GPU arrays. The stream each array names
        is synchronized before the request is sent; the product is complete
        when the call returns.

        Raises:
            TypeError: Unsupported or mismatched dtypes.
            ValueError: An operand is not 2-D or 3-D, compute is unknown, or
                result_ttl is not positive (or given without keep).
            MatmulError: The server refused or failed the request (e.g.
                INVALID_ARGUMENT for mismatched inner dimensions,
                NOT_FOUND for a deleted or expired handle,
                RESOURCE_EXHAUSTED over its limits or the client's quota of
                stored tensors, DEADLINE_EXCEEDED, UNAVAILABLE), or, for
                GPU arrays, FAILED_PRECONDITION (a host-engine server, or
                one not driving the array's GPU) and PERMISSION_DENIED (not
                over the Unix socket).
        """
        if out is not None or uses_gpu_memory(a, b):
            if keep or result_ttl is not None or dtype is not None:
                raise ValueError("keep, result_ttl and dtype are not taken with GPU arrays")
            if not uses_gpu_memory(a, b):
                raise TypeError("out= is for GPU operands; pass a and b on the GPU")
            return self._cuda().multiply(
                a, b, out=out, transpose_a=transpose_a, transpose_b=transpose_b,
                compute=compute, timeout=timeout,
            )
        if self._native is not None:
            args, wire = _native_args(
                a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl,
                self._deadline(timeout),
            )
            try:
                value = self._native.multiply(*args)
            except _native.StatusError as error:
                raise _native_error(error) from None
            return self._native_value(value, wire, bool(keep))
        request, wire = _multiply_request(
            a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl
        )
        home = self._router.home(request.a_handle, request.b_handle)
        try:
            response = self._router.stub(home, self._stub).Multiply(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error
        return self._product(response, wire, bool(keep))

    def multiply_streamed(
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
        """:meth:`multiply` over the MultiplyStream RPC: the operands go out
        and the product comes back in chunks of about ``chunk_bytes``, so
        neither is bounded by the server's message size (a 16384 x 16384
        float32 product is 1 GiB), and the server copies each chunk to the
        GPU while the next one is on the wire. Same arguments and errors as
        :meth:`multiply` (without keep); ValueError for a chunk_bytes that
        is not positive.

        ``chunk_bytes`` and ``stripes`` left at None are chosen from the
        multiply's size, as the C++ library does: one call and 4 MiB chunks
        up to 96 MiB of operands and product, one more call per 96 MiB
        above (at most 8), 16 MiB chunks from 512 MiB.

        ``stripes`` (1 to 16): the multiply travels on that many
        MultiplyStream calls, each on its own connection (opened on first
        use and kept until :meth:`close`), so that one connection's rate
        does not bound it: the chunks go out round-robin over them and the
        product comes back over all of them. The server must support
        striping. Both paths stripe; the pure-Python one moves its chunks
        under the GIL, the native one does not.
        """
        chunk_bytes, stripes = _stream_plan(
            _wire_bytes(a, b, transpose_a, transpose_b), chunk_bytes, stripes, True
        )
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes={chunk_bytes}: expected a positive size")
        stripes = _check_stripes(stripes)
        if self._native is not None:
            args, wire = _native_args(
                a, b, transpose_a, transpose_b, compute, dtype, False, None, self._deadline(timeout)
            )
            try:
                product = self._native.multiply_streamed(
                    *args[:11], int(chunk_bytes), **({"stripes": stripes} if stripes > 1 else {})
                )
            except _native.StatusError as error:
                raise _native_error(error) from None
            return _native_array(product, wire)
        request, wire = _multiply_request(a, b, transpose_a, transpose_b, compute, dtype)
        home = self._router.home(request.a_handle, request.b_handle)
        if home is not None:
            # A stored operand's server, on one call (the stripes' channels
            # go over the spread).
            try:
                return _multiply_stream(
                    self._router.stub(home, self._stub), request, wire, chunk_bytes,
                    self._deadline(timeout), self._metadata,
                )
            except MatmulError as error:
                raise routed_error(error, home) from None
        if stripes > 1:
            return _multiply_striped(
                self._stripe_channels_for(stripes), request, wire,
                chunk_bytes, self._deadline(timeout), self._metadata,
            )
        return _multiply_stream(
            self._stub, request, wire, chunk_bytes, self._deadline(timeout), self._metadata
        )

    def multiply_async(
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
    ) -> "concurrent.futures.Future[Any]":
        """Starts :meth:`multiply` and returns at once.

        Arguments are those of :meth:`multiply`, and invalid ones raise here.
        The future's result is the product (a :class:`Handle` with keep=True);
        a failed RPC sets a :class:`MatmulError`. Cancelling the future
        cancels the RPC. The operands are encoded before this returns, so
        they may be changed afterwards.
        """
        if self._native is not None:
            return self._native_multiply_async(
                a, b, transpose_a, transpose_b, compute, dtype, timeout, keep, result_ttl
            )
        request, wire = _multiply_request(
            a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl
        )
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        home = self._router.home(request.a_handle, request.b_handle)
        call = self._router.stub(home, self._stub).Multiply.future(
            request, timeout=self._deadline(timeout), metadata=self._metadata
        )

        def on_rpc_done(finished: grpc.Future) -> None:
            # Runs on a gRPC thread; an exception escaping here would be lost.
            if not future.set_running_or_notify_cancel():
                return  # The caller cancelled the future.
            if finished.code() is not grpc.StatusCode.OK:
                future.set_exception(routed_error(MatmulError.from_call(finished), home))
                return
            try:
                future.set_result(self._product(finished.result(), wire, bool(keep)))
            except Exception as error:  # noqa: BLE001 - handed to the caller.
                future.set_exception(error)

        def on_future_done(done: concurrent.futures.Future) -> None:
            if done.cancelled():
                call.cancel()

        call.add_done_callback(on_rpc_done)
        future.add_done_callback(on_future_done)
        return future

    def upload(
        self,
        array: npt.ArrayLike,
        *,
        device: Optional[int] = None,
        ttl: Optional[float] = None,
        dtype: Any = None,
        timeout: Optional[float] = None,
        near: Optional[HandleOrId] = None,
    ) -> Handle:
        """Stores ``array`` (2-D or 3-D) on the server and returns its :class:`Handle`.

        An array of any size: one over 64 MiB travels in chunks
        (UploadStream), so the server's message size does not bound it. A
        call that fails or is interrupted midway stores and charges nothing.

        Args:
            array: Any array-like, as a multiply operand.
            device: The device to store it on (an index from
                ``server_info().devices``); None: the server picks the least
                loaded. Operands of one multiply must live on the same device.
            ttl: Lifetime in seconds unless deleted (rounded up); None: the
                server's default (``server_info().limits.default_handle_ttl_seconds``).
            dtype: As in :meth:`multiply`: None keeps the array's dtype,
                "bfloat16" rounds it to bfloat16, a NumPy dtype converts it.
            timeout: Deadline in seconds; None for the client's default.
            near: A stored tensor (a :class:`Handle` or its id): store this
                one on the server that holds it, and on its device unless
                ``device`` says otherwise, so that the two can be operands of
                one multiply. None: over the spread, like any call that names
                no handle.

        Raises:
            TypeError, ValueError: As for a multiply operand; a bad ttl.
            MatmulError: RESOURCE_EXHAUSTED over the client's quota (bytes or
                tensors); INVALID_ARGUMENT for an unknown device or a ttl over
                the server's maximum; UNIMPLEMENTED for an array over 64 MiB
                and a server without chunked uploads.
        """
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
        if self._native is not None:
            args = _native_upload_args(x, dtype, device, ttl, self._deadline(timeout), near_id)
            try:
                value = self._native.upload(*args)
            except _native.StatusError as error:
                raise _native_error(error) from None
            return _handle_from_native(value, self)
        wire = resolve_single_wire_type(x, dtype, "array")
        values = upload_values(x, wire)
        ttl_s = ttl_seconds(ttl, "ttl")
        home = self._router.home(near_id)
        if not chunked(values):
            request = matmul_pb2.UploadRequest(
                tensor=matmul_pb2.Tensor(shape=values.shape, dtype=wire.proto, data=values.tobytes()),
                ttl_seconds=ttl_s,
            )
            if device is not None:
                request.device = int(device)
            try:
                response = self._router.stub(home, self._stub).Upload(
                    request, timeout=self._deadline(timeout), metadata=self._metadata
                )
                return Handle.from_proto(response.handle, self)
            except grpc.RpcError as error:
                if not too_large(error):
                    raise routed_error(MatmulError.from_call(error), home) from error
                # Over this server's message size: in chunks under it.
                return self._upload_stream(values, wire, device, ttl_s, timeout, home, smaller=True)
        return self._upload_stream(values, wire, device, ttl_s, timeout, home, smaller=False)

    def _upload_stream(
        self, values: np.ndarray, wire: WireType, device: Optional[int], ttl_s: int,
        timeout: Optional[float], home: Optional[str], smaller: bool,
    ) -> Handle:
        """``values`` stored by an UploadStream, on ``home`` (None: over the
        spread); ``smaller``: in chunks under the server's message size
        (GetServerInfo), as they are when chunks of the default size are
        refused as too large."""
        stub = self._router.stub(home, self._stub)
        chunk = None
        for attempt in range(2):
            try:
                if smaller:
                    info = stub.GetServerInfo(
                        matmul_pb2.GetServerInfoRequest(), timeout=self._deadline(timeout), metadata=self._metadata
                    )
                    chunk = chunk_under(info.limits.max_message_bytes)
                response = stub.UploadStream(
                    upload_messages(values, wire, device, ttl_s, chunk),
                    timeout=self._deadline(timeout),
                    metadata=self._metadata,
                )
                return Handle.from_proto(response.handle, self)
            except grpc.RpcError as error:
                if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                    raise unimplemented_upload(error) from error
                if smaller or not too_large(error):
                    raise routed_error(MatmulError.from_call(error), home) from error
                smaller = True
        raise AssertionError("unreachable")

    def download(self, handle: HandleOrId, *, timeout: Optional[float] = None) -> np.ndarray:
        """The data of a stored tensor (a :class:`Handle` or its id), as a new array.

        float32, float64 and float16 tensors come back in their dtype;
        bfloat16 ones as float32 (holding the bfloat16 values exactly), as
        multiply results do. A tensor of any size: it comes in chunks
        (DownloadStream; from a server without it, in one message).

        Raises:
            MatmulError: NOT_FOUND for an unknown, deleted or expired handle.
        """
        if self._native is not None:
            ident = handle_id(handle)
            try:
                value = self._native.download(ident, _float_or_none(self._deadline(timeout)))
            except _native.StatusError as error:
                raise _native_error(error) from None
            return _downloaded(value)
        ident = handle_id(handle)
        home = self._router.home(ident)
        stub = self._router.stub(home, self._stub)
        assembler = DownloadAssembler()
        call = stub.DownloadStream(
            matmul_pb2.DownloadStreamRequest(handle=ident, chunk_bytes=DOWNLOAD_CHUNK_BYTES),
            timeout=self._deadline(timeout),
            metadata=self._metadata,
        )
        try:
            for response in call:
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
        request = matmul_pb2.DownloadRequest(handle=ident)
        try:
            response = stub.Download(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error
        tensor = response.tensor
        name = DTYPE_NAMES.get(tensor.dtype)
        if name is None:
            raise MatmulError(grpc.StatusCode.INTERNAL, f"the server sent a tensor of unknown dtype {tensor.dtype}")
        return from_tensor(tensor, stored_wire_type(name))

    def delete(self, handle: HandleOrId, *, timeout: Optional[float] = None) -> None:
        """Frees a stored tensor (a :class:`Handle` or its id).

        Raises:
            MatmulError: NOT_FOUND if it does not exist (any more).
        """
        if self._native is not None:
            ident = handle_id(handle)
            try:
                self._native.delete(ident, _float_or_none(self._deadline(timeout)))
            except _native.StatusError as error:
                raise _native_error(error) from None
            return
        request = matmul_pb2.DeleteRequest(handle=handle_id(handle))
        home = self._router.home(request.handle)
        try:
            self._router.stub(home, self._stub).Delete(
                request, timeout=self._deadline(timeout), metadata=self._metadata
            )
        except grpc.RpcError as error:
            raise routed_error(MatmulError.from_call(error), home) from error

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """The server's engine, devices, dtypes and limits."""
        try:
            response = self._stub.GetServerInfo(
                matmul_pb2.GetServerInfoRequest(),
                timeout=self._deadline(timeout),
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        return ServerInfo.from_proto(response)

    def health(self, service: str = "", *, timeout: Optional[float] = None) -> str:
        """The grpc.health.v1 status of ``service``: "SERVING", "NOT_SERVING", ...

        The server knows "" (the whole server), "matmul.v1.MatmulService",
        "liveness" and "readiness"; another name raises MatmulError(NOT_FOUND).
        """
        try:
            response = self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._deadline(timeout)
            )
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_for_connected(self, timeout: Optional[float] = None) -> None:
        """Connects every channel this client has opened (its gRPC channel,
        those pure-Python striped multiplies opened, and the native core's)
        and waits until all are ready, riding out a failed connect by gRPC's
        reconnect backoff.

        Calls need not wait for it: a call connects its channel itself, and
        fails UNAVAILABLE if that first connect fails (see
        docs/RELIABILITY.md).

        Args:
            timeout: Seconds to wait at most; None: the client's default
                timeout (no bound if that is None too).

        Raises:
            MatmulError: DEADLINE_EXCEEDED when the timeout passes first.
        """
        limit = self._deadline(timeout)
        end = None if limit is None else time.monotonic() + limit
        with self._stripe_lock:
            channels = [self._channel] + list(self._stripe_channels)
            for pinned in self._pinned_stripes.values():
                channels.extend(pinned)
        unconnected = first_unconnected(channels, end)
        if unconnected is not None:
            raise MatmulError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"client: channel {unconnected} of {len(channels)} not connected after {limit} s",
            )
        if self._native is not None:
            try:
                self._native.wait_for_connected(_float_or_none(remaining_seconds(end)))
            except _native.StatusError as error:
                raise _native_error(error) from None

    def shared_memory(self, nbytes: int, **kwargs: Any) -> Any:
        """A :class:`~matmul_client.shared_memory.SharedMemory` session of
        ``nbytes`` registered with the server (a ``unix:`` target on its
        host): arrays in it are multiplied without crossing the socket.
        Keyword arguments go to SharedMemory (mode, unlink_when_registered,
        timeout); use it as a context manager."""
        from .shared_memory import SharedMemory

        return SharedMemory(self, nbytes, **kwargs)

    def _cuda(self) -> Any:
        """This client's GPU-memory registrations, made on first use."""
        with self._stripe_lock:
            if self._cuda_memory is None:
                self._cuda_memory = CudaMemory(self)
            return self._cuda_memory

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled (on the native
        path, native calls in flight finish first). GPU-memory
        registrations end."""
        with self._stripe_lock:
            cuda, self._cuda_memory = self._cuda_memory, None
        if cuda is not None:
            cuda.close()
        self._native = None
        self._channel.close()
        for channel in self._router.take_channels():
            channel.close()
        with self._stripe_lock:
            channels, self._stripe_channels = self._stripe_channels, []
            for pinned in self._pinned_stripes.values():
                channels.extend(pinned)
            self._pinned_stripes = {}
        for channel in channels:
            channel.close()

    def _home_channel(self, address: str, *more: ChannelOption) -> grpc.Channel:
        """A channel to the one server at ``address`` (a handle's, or a
        striped multiply's), with the target's settings and ``more``; under
        TLS it checks the certificate against the target's name, as the
        spread does."""
        target, tls, options = self._channel_args
        extra: Tuple[ChannelOption, ...] = ()
        if tls_config(tls) is not None and ip_target_authority(target):
            extra = (("grpc.default_authority", ip_target_authority(target)),)
        return make_channel(address, tls, (*options, *extra, *more))

    def _stripe_channels_for(self, stripes: int) -> List[grpc.Channel]:
        """The first ``stripes`` of the connections that pure-Python striped
        multiplies use, opened on first use and kept until :meth:`close`.

        Every call of a striped multiply must reach one server (the joins
        find their start there): when the client spreads over several
        servers, each striped multiply picks the next of the addresses the
        target names (round-robin, from a random one) and its stripes go on
        connections to that server alone. (The C++ library asks the spread
        with a call and follows its peer; grpcio's calls do not tell their
        peer.) A target whose servers cannot be told leaves the stripes on
        the spread."""
        if self._router.spreads:
            addresses = target_addresses(self._channel_args[0])
            if len(addresses) > 1:
                with self._stripe_lock:
                    self._next_pinned = (self._next_pinned + 1) % len(addresses)
                    address = addresses[self._next_pinned]
                return self._pinned_stripe_channels(address, stripes)
        with self._stripe_lock:
            target, tls, options = self._channel_args
            while len(self._stripe_channels) < stripes:
                # Channels that differ in an argument never share a
                # connection.
                index = len(self._stripe_channels)
                self._stripe_channels.append(
                    make_channel(
                        target, tls,
                        (*options, ("matmul.stripe", index), ("grpc.use_local_subchannel_pool", 1)),
                    )
                )
            return self._stripe_channels[:stripes]

    def _pinned_stripe_channels(self, address: str, stripes: int) -> List[grpc.Channel]:
        """``stripes`` connections to the one server at ``address``
        (host:port), opened on first use; past _MAX_PINNED_SERVERS servers
        the oldest's are closed."""
        closed: List[grpc.Channel] = []
        with self._stripe_lock:
            pinned = self._pinned_stripes.get(address)
            if pinned is None:
                if len(self._pinned_stripes) >= _MAX_PINNED_SERVERS:
                    closed = self._pinned_stripes.pop(next(iter(self._pinned_stripes)))
                pinned = self._pinned_stripes[address] = []
            while len(pinned) < stripes:
                pinned.append(
                    self._home_channel(
                        address, ("matmul.stripe", len(pinned)), ("grpc.use_local_subchannel_pool", 1)
                    )
                )
            chosen = pinned[:stripes]
        for channel in closed:
            channel.close()
        return chosen

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout

    def _native_value(self, value: Any, wire: WireType, keep: bool) -> Any:
        """A native multiply's result: the product array, or with keep the
        kept product's Handle."""
        if keep:
            return _handle_from_native(value, self)
        return _native_array(value, wire)

    def _native_multiply_async(
        self, a: Operand, b: Operand, transpose_a: bool, transpose_b: bool, compute: str,
        dtype: Any, timeout: Optional[float], keep: bool, result_ttl: Optional[float],
    ) -> "concurrent.futures.Future[Any]":
        """multiply_async on the native core: the C++ library's asynchronous
        call completes the future from a gRPC thread; cancelling the future
        cancels the RPC."""
        args, wire = _native_args(
            a, b, transpose_a, transpose_b, compute, dtype, keep, result_ttl,
            self._deadline(timeout),
        )
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def done(ok: bool, value: Any) -> None:
            # On a gRPC thread, with the GIL; an exception here would be lost.
            if not future.set_running_or_notify_cancel():
                return  # The caller cancelled the future.
            if not ok:
                future.set_exception(_native_status(*value))
                return
            try:
                future.set_result(self._native_value(value, wire, bool(keep)))
            except Exception as error:  # noqa: BLE001 - handed to the caller.
                future.set_exception(error)

        call = self._native.multiply_async(*args, done)

        def on_future_done(finished: concurrent.futures.Future) -> None:
            if finished.cancelled():
                call.cancel()

        future.add_done_callback(on_future_done)
        return future

    def _product(self, response: matmul_pb2.MultiplyResponse, wire: WireType, keep: bool) -> Any:
        """The product out of a Multiply response: a Handle when kept."""
        if keep:
            if not response.HasField("c_handle"):
                raise MatmulError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    "the server returned the product instead of keeping it: it does not "
                    "support stored tensors",
                )
            return Handle.from_proto(response.c_handle, self)
        return from_tensor(response.c, wire)
