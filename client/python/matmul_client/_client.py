"""Client: NumPy matrix products computed by a remote matmul server."""

from __future__ import annotations

import concurrent.futures
from typing import Any, Optional, Sequence, Tuple

import grpc
import numpy as np
import numpy.typing as npt

from ._channel import ChannelOption, TlsArgument, make_channel
from ._errors import MatmulError
from ._info import ServerInfo
from ._proto.grpc.health.v1 import health_pb2, health_pb2_grpc
from ._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc
from ._tensors import WireType, from_tensor, resolve_wire_type, to_tensor

_COMPUTE_MODES = {
    "strict": matmul_pb2.COMPUTE_MODE_STRICT,
    "tf32": matmul_pb2.COMPUTE_MODE_TF32,
}


def _multiply_request(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    transpose_a: bool,
    transpose_b: bool,
    compute: str,
    dtype: Any,
) -> Tuple[matmul_pb2.MultiplyRequest, WireType]:
    """Validates and encodes a Multiply call's arguments."""
    a_array, b_array = np.asarray(a), np.asarray(b)
    for name, x in (("a", a_array), ("b", b_array)):
        if x.ndim not in (2, 3):
            raise ValueError(
                f"{name} has {x.ndim} dimension(s) (shape {x.shape}); the service takes "
                f"2-D [rows, cols] or 3-D [batch, rows, cols] operands "
                f"(make a vector v a matrix with v[None, :] or v[:, None])"
            )
    if compute not in _COMPUTE_MODES:
        raise ValueError(f"compute={compute!r}: expected one of {sorted(_COMPUTE_MODES)}")
    wire = resolve_wire_type(a_array, b_array, dtype)
    a_tensor, transpose_a = to_tensor(a_array, wire, bool(transpose_a))
    b_tensor, transpose_b = to_tensor(b_array, wire, bool(transpose_b))
    request = matmul_pb2.MultiplyRequest(
        a=a_tensor,
        b=b_tensor,
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        compute_mode=_COMPUTE_MODES[compute],
    )
    return request, wire


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
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: Optional[float] = None,
        tls: TlsArgument = None,
        options: Sequence[ChannelOption] = (),
    ) -> None:
        self._timeout = timeout
        self._channel = make_channel(target, tls, options)
        self._stub = matmul_pb2_grpc.MatmulServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def multiply(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        compute: str = "strict",
        dtype: Any = None,
        timeout: Optional[float] = None,
    ) -> np.ndarray:
        """Returns ``numpy.matmul(op(a), op(b))``, computed by the server.

        op(x) is x, or x with its last two axes swapped when transpose_x is
        set. Operands are 2-D [rows, cols] or 3-D [batch, rows, cols]; a 2-D
        operand against a 3-D one, or a batch of 1, is broadcast over the
        batch. The result is [m, n], or [batch, m, n] if either operand is 3-D.

        Args:
            a: Left operand (any array-like; any memory layout or byte order).
            b: Right operand.
            transpose_a: Use a with its last two axes swapped.
            transpose_b: Use b with its last two axes swapped.
            compute: "strict" (full precision of the dtype) or "tf32" (the
                server may use TF32 tensor cores for float32).
            dtype: None: both operands must already have the same dtype,
                float32, float64, float16 (or ml_dtypes.bfloat16), and the
                result has it too. "bfloat16": operands are rounded to
                bfloat16 (nearest even) and the result is float32 (holding
                bfloat16 values exactly). A NumPy dtype: both operands are
                converted to it first.
            timeout: Deadline in seconds; None for the client's default.

        Raises:
            TypeError: Unsupported or mismatched dtypes.
            ValueError: An operand is not 2-D or 3-D, or compute is unknown.
            MatmulError: The server refused or failed the request (e.g.
                INVALID_ARGUMENT for mismatched inner dimensions,
                RESOURCE_EXHAUSTED over its limits, DEADLINE_EXCEEDED,
                UNAVAILABLE).
        """
        request, wire = _multiply_request(a, b, transpose_a, transpose_b, compute, dtype)
        try:
            response = self._stub.Multiply(request, timeout=self._deadline(timeout))
        except grpc.RpcError as error:
            raise MatmulError.from_call(error) from error
        return from_tensor(response.c, wire)

    def multiply_async(
        self,
        a: npt.ArrayLike,
        b: npt.ArrayLike,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
        compute: str = "strict",
        dtype: Any = None,
        timeout: Optional[float] = None,
    ) -> "concurrent.futures.Future[np.ndarray]":
        """Starts :meth:`multiply` and returns at once.

        Arguments are those of :meth:`multiply`, and invalid ones raise here.
        The future's result is the product; a failed RPC sets a
        :class:`MatmulError`. Cancelling the future cancels the RPC. The
        operands are encoded before this returns, so they may be changed
        afterwards.
        """
        request, wire = _multiply_request(a, b, transpose_a, transpose_b, compute, dtype)
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        call = self._stub.Multiply.future(request, timeout=self._deadline(timeout))

        def on_rpc_done(finished: grpc.Future) -> None:
            # Runs on a gRPC thread; an exception escaping here would be lost.
            if not future.set_running_or_notify_cancel():
                return  # The caller cancelled the future.
            if finished.code() is not grpc.StatusCode.OK:
                future.set_exception(MatmulError.from_call(finished))
                return
            try:
                future.set_result(from_tensor(finished.result().c, wire))
            except Exception as error:  # noqa: BLE001 - handed to the caller.
                future.set_exception(error)

        def on_future_done(done: concurrent.futures.Future) -> None:
            if done.cancelled():
                call.cancel()

        call.add_done_callback(on_rpc_done)
        future.add_done_callback(on_future_done)
        return future

    def server_info(self, *, timeout: Optional[float] = None) -> ServerInfo:
        """The server's engine, devices, dtypes and limits."""
        try:
            response = self._stub.GetServerInfo(
                matmul_pb2.GetServerInfoRequest(), timeout=self._deadline(timeout)
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

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self._timeout if timeout is None else timeout
