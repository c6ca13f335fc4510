"""The streamed multiply (the MultiplyStream RPC) on the pure-Python path:
a request's operands cut into chunks of whole elements (B first), the
messages of one call or of the calls of a striped one, the product
assembled from the chunks that come back, and the calls themselves (one
call, or one call per connection, read by a thread each, for a striped
multiply). AsyncClient's pure path sends the same messages and assembles
the product the same way on its grpc.aio call; the native core streams in
the C++ client library."""

from __future__ import annotations

import os
import threading
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._errors import _STATUS_CODES, MatmulError
from ._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc
from ._tensors import WireType

#: Bytes per element of each wire dtype.
_ELEMENT_BYTES = {
    matmul_pb2.DTYPE_FLOAT32: 4,
    matmul_pb2.DTYPE_FLOAT64: 8,
    matmul_pb2.DTYPE_FLOAT16: 2,
    matmul_pb2.DTYPE_BFLOAT16: 2,
}


def _stream_operands(
    request: matmul_pb2.MultiplyRequest, chunk_bytes: int
) -> Tuple[List[Tuple[int, bytes]], int]:
    """The operands of ``request`` sent in chunks, as (Operand, data), their
    data taken out of it, and the chunk size (whole elements near
    ``chunk_bytes``). B comes first: once all of B is on the device the
    server multiplies A's rows in panels as they arrive and sends their
    product rows while the rest of A is on the wire."""
    operands = []
    for name, operand in (("b", matmul_pb2.OPERAND_B), ("a", matmul_pb2.OPERAND_A)):
        if request.HasField(name):
            tensor = getattr(request, name)
            operands.append((operand, tensor.data))
            tensor.data = b""
    elem = _ELEMENT_BYTES[request.a.dtype if request.HasField("a") else request.b.dtype]
    return operands, max(elem, chunk_bytes // elem * elem)


def _stream_messages(
    request: matmul_pb2.MultiplyRequest, chunk_bytes: int
) -> Tuple[Iterator[matmul_pb2.MultiplyStreamRequest], int]:
    """The MultiplyStream messages of ``request`` (whose operands' data is
    taken out of it): the start, then each operand in chunks of about
    ``chunk_bytes`` (whole elements). Returns them and the chunk size."""
    operands, step = _stream_operands(request, chunk_bytes)

    def messages() -> Iterator[matmul_pb2.MultiplyStreamRequest]:
        yield matmul_pb2.MultiplyStreamRequest(
            request_id=1,
            start=matmul_pb2.MultiplyStreamStart(request=request, result_chunk_bytes=step),
        )
        for operand, data in operands:
            view = memoryview(data)
            for at in range(0, len(data), step):
                yield matmul_pb2.MultiplyStreamRequest(
                    request_id=1,
                    chunk=matmul_pb2.OperandChunk(
                        operand=operand, offset=at, data=bytes(view[at : at + step])
                    ),
                )

    return messages(), step


#: Most MultiplyStream calls one streamed multiply may be striped over.
MAX_STRIPES = 16


def _stream_plan(
    wire_bytes: int, chunk_bytes: Optional[int], stripes: Optional[int], can_stripe: bool = True
) -> Tuple[int, int]:
    """``(chunk_bytes, stripes)`` for a streamed multiply that moves
    ``wire_bytes`` (operands sent and product received), where the caller
    gave None: as the C++ library's StreamOptionsFor, one call and 4 MiB
    chunks up to 96 MiB, one more call per 96 MiB above (at most 8; one
    where this path cannot stripe), and 16 MiB chunks from 512 MiB."""
    mib = 1 << 20
    if stripes is None:
        stripes = min(max(wire_bytes // (96 * mib), 1), 8) if can_stripe else 1
    if chunk_bytes is None:
        chunk_bytes = 16 * mib if wire_bytes >= 512 * mib else 4 * mib
    return chunk_bytes, stripes


def _wire_bytes(a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> int:
    """The bytes a streamed multiply of ``a`` and ``b`` moves, as far as the
    client can tell: the arrays' bytes, and the product's where both are
    arrays of 2 or 3 dimensions (a stored tensor's handle counts nothing)."""
    arrays = [x if hasattr(x, "nbytes") and hasattr(x, "shape") else None for x in (a, b)]
    total = sum(int(x.nbytes) for x in arrays if x is not None)
    x, y = arrays
    if x is not None and y is not None and x.ndim in (2, 3) and y.ndim in (2, 3):
        m = x.shape[-1] if transpose_a else x.shape[-2]
        n = y.shape[-2] if transpose_b else y.shape[-1]
        batch = max(x.shape[0] if x.ndim == 3 else 1, y.shape[0] if y.ndim == 3 else 1)
        total += int(batch) * int(m) * int(n) * int(x.itemsize)
    return total


def _check_stripes(stripes: Any) -> int:
    if isinstance(stripes, bool) or not isinstance(stripes, (int, np.integer)):
        raise TypeError(f"stripes: expected an int, got {type(stripes).__name__}")
    if not 1 <= stripes <= MAX_STRIPES:
        raise ValueError(f"stripes={stripes}: expected 1 to {MAX_STRIPES} MultiplyStream calls")
    return int(stripes)


def _striped_messages(
    request: matmul_pb2.MultiplyRequest, chunk_bytes: int, stripes: int
) -> List[Iterator[matmul_pb2.MultiplyStreamRequest]]:
    """The messages of each of the ``stripes`` MultiplyStream calls that carry
    ``request`` (whose operands' data is taken out of it): the first opens
    the multiply under a random stripe key, the others join it, and the
    operands' chunks go round-robin over them."""
    operands, step = _stream_operands(request, chunk_bytes)
    key = os.urandom(16)
    first = [
        matmul_pb2.MultiplyStreamRequest(
            request_id=1,
            start=matmul_pb2.MultiplyStreamStart(
                request=request, result_chunk_bytes=step, stripe_key=key, stripes=stripes
            ),
        ),
        matmul_pb2.MultiplyStreamRequest(
            request_id=1, join=matmul_pb2.MultiplyStreamJoin(stripe_key=key)
        ),
    ]
    pieces = [(op, data, at) for op, data in operands for at in range(0, len(data), step)]

    def messages(s: int) -> Iterator[matmul_pb2.MultiplyStreamRequest]:
        yield first[0 if s == 0 else 1]
        for operand, data, at in pieces[s::stripes]:
            yield matmul_pb2.MultiplyStreamRequest(
                request_id=1,
                chunk=matmul_pb2.OperandChunk(
                    operand=operand, offset=at, data=bytes(memoryview(data)[at : at + step])
                ),
            )

    return [messages(s) for s in range(stripes)]


class _StreamProduct:
    """The product of a MultiplyStream (or of the calls of a striped one),
    assembled from its responses. Thread-safe."""

    def __init__(self) -> None:
        self.shape: Tuple[int, ...] = ()
        self.product: Optional[bytearray] = None
        self.received = 0
        self._lock = threading.Lock()

    def add(self, response: matmul_pb2.MultiplyStreamResponse) -> None:
        with self._lock:
            self._add(response)

    def _add(self, response: matmul_pb2.MultiplyStreamResponse) -> None:
        kind = response.WhichOneof("kind")
        if kind == "error":
            raise MatmulError(
                _STATUS_CODES.get(response.error.code, grpc.StatusCode.UNKNOWN),
                response.error.message,
            )
        if kind == "result":
            if self.product is not None:  # Each call of a striped multiply.
                if len(self.product) != response.result.bytes:
                    raise MatmulError(
                        grpc.StatusCode.DATA_LOSS,
                        f"the server described the product as {len(self.product)} bytes "
                        f"on one stream and as {response.result.bytes} on another",
                    )
                return
            self.shape = tuple(response.result.shape)
            self.product = bytearray(response.result.bytes)
        elif kind == "chunk":
            at, data = response.chunk.offset, response.chunk.data
            if self.product is None or at < 0 or at + len(data) > len(self.product):
                raise MatmulError(
                    grpc.StatusCode.DATA_LOSS,
                    f"the server sent a product chunk of {len(data)} bytes at offset "
                    f"{at} outside the product",
                )
            self.product[at : at + len(data)] = data
            self.received += len(data)

    def result(self, wire: WireType) -> np.ndarray:
        if self.product is None or self.received != len(self.product):
            size = 0 if self.product is None else len(self.product)
            raise MatmulError(
                grpc.StatusCode.DATA_LOSS,
                f"the stream ended with {self.received} of {size} product bytes",
            )
        return wire.from_wire(self.product).reshape(self.shape)


def _multiply_stream(
    stub: matmul_pb2_grpc.MatmulServiceStub,
    request: matmul_pb2.MultiplyRequest,
    wire: WireType,
    chunk_bytes: int,
    timeout: Optional[float],
    metadata: Optional[Sequence[Tuple[str, str]]],
) -> np.ndarray:
    """A streamed multiply of ``request`` (whose operands' data is taken out
    of it) on one MultiplyStream call of ``stub``."""
    messages, _ = _stream_messages(request, chunk_bytes)
    product = _StreamProduct()
    try:
        for response in stub.MultiplyStream(messages, timeout=timeout, metadata=metadata):
            product.add(response)
    except MatmulError:
        raise  # The stream's own error, or a malformed product (an RpcError too).
    except grpc.RpcError as error:
        raise MatmulError.from_call(error) from error
    return product.result(wire)


def _multiply_striped(
    channels: Sequence[grpc.Channel],
    request: matmul_pb2.MultiplyRequest,
    wire: WireType,
    chunk_bytes: int,
    timeout: Optional[float],
    metadata: Optional[Sequence[Tuple[str, str]]],
) -> np.ndarray:
    """A streamed multiply of ``request`` striped over one MultiplyStream
    call on each of ``channels`` (its own connection): one thread reads each
    call; the first error cancels the others and is raised. A join rides a
    connection that may be opened just now: if its first connect fails, it
    waits for the channel's reconnect (wait_for_ready, bounded by the
    timeout; the first call's end cancels it) rather than fail the multiply
    UNAVAILABLE at once, as the C++ client's joins do. The first call fails
    fast as any call does."""
    product = _StreamProduct()
    calls = [
        matmul_pb2_grpc.MatmulServiceStub(channel).MultiplyStream(
            messages, timeout=timeout, metadata=metadata, wait_for_ready=s > 0
        )
        for s, (channel, messages) in enumerate(
            zip(channels, _striped_messages(request, chunk_bytes, len(channels)))
        )
    ]
    errors: List[MatmulError] = []
    lock = threading.Lock()

    def read(call: Any) -> None:
        try:
            for response in call:
                product.add(response)
            return
        except MatmulError as error:  # Before RpcError, which it is.
            failure = error
        except grpc.RpcError as error:
            failure = MatmulError.from_call(error)
        with lock:
            errors.append(failure)
        for other in calls:
            other.cancel()

    readers = [threading.Thread(target=read, args=(call,), daemon=True) for call in calls[1:]]
    for reader in readers:
        reader.start()
    read(calls[0])
    for reader in readers:
        reader.join()
    if errors:
        raise errors[0]
    return product.result(wire)
