"""Stored tensors of any size on the pure-Python path: the messages of a
chunked upload (UploadStream) and the reassembly of a chunked download
(DownloadStream). Client and AsyncClient share them; the native core does
the same in the C++ library.
"""

from __future__ import annotations

from typing import Iterator, Optional

import grpc
import numpy as np

from ._errors import MatmulError
from ._proto.matmul.v1 import matmul_pb2
from ._tensors import DTYPE_NAMES, WireType, stored_wire_type

#: An upload larger than this travels in chunks (UploadStream), so that no
#: message bounds its size; a smaller one in one message (Upload), which
#: servers without UploadStream take too.
UPLOAD_CHUNKED_ABOVE_BYTES = 64 << 20
#: The chunks of a chunked upload (the server takes at most 64 MiB).
UPLOAD_CHUNK_BYTES = 16 << 20
#: The chunks a download asks for.
DOWNLOAD_CHUNK_BYTES = 16 << 20


def upload_values(x: np.ndarray, wire: WireType) -> np.ndarray:
    """``x`` as the row-major little-endian elements a stored tensor of
    ``wire`` holds (``x`` itself where it already is that)."""
    return np.ascontiguousarray(wire.to_wire(x))


def chunked(values: np.ndarray) -> bool:
    """Whether ``values`` (upload_values) go as an UploadStream."""
    return values.nbytes > UPLOAD_CHUNKED_ABOVE_BYTES


def upload_messages(
    values: np.ndarray, wire: WireType, device: Optional[int], ttl: int, chunk_bytes: Optional[int] = None
) -> Iterator[matmul_pb2.UploadStreamRequest]:
    """The messages of an UploadStream that stores ``values``
    (upload_values): the start, then the bytes in order, in chunks of about
    ``chunk_bytes`` (whole elements; None: UPLOAD_CHUNK_BYTES), each copied
    out as it is sent."""
    start = matmul_pb2.UploadRequest(
        tensor=matmul_pb2.Tensor(shape=values.shape, dtype=wire.proto), ttl_seconds=ttl
    )
    if device is not None:
        start.device = int(device)
    if chunk_bytes is None:
        chunk_bytes = UPLOAD_CHUNK_BYTES
    element = values.dtype.itemsize
    chunk = max(element, min(chunk_bytes, 64 << 20) // element * element)
    yield matmul_pb2.UploadStreamRequest(start=start)
    data = memoryview(values.reshape(-1).view(np.uint8))
    for offset in range(0, len(data), chunk):
        yield matmul_pb2.UploadStreamRequest(
            chunk=matmul_pb2.TensorChunk(offset=offset, data=data[offset : offset + chunk].tobytes())
        )


def too_large(error: grpc.RpcError) -> bool:
    """Whether ``error`` refused a message as over the size limit (then the
    upload goes in chunks)."""
    return error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (error.details() or "")


def chunk_under(max_message_bytes: int) -> int:
    """Chunks that fit messages of ``max_message_bytes`` (the server's limit)."""
    return max(1, min(UPLOAD_CHUNK_BYTES, max(max_message_bytes // 2, max_message_bytes - 1024)))


def unimplemented_upload(error: grpc.RpcError) -> MatmulError:
    """The error of an UploadStream a server does not have."""
    return MatmulError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"the server does not take chunked uploads (UploadStream: {error.details()}); it stores "
        f"tensors of at most its max message size, which upload sends in one message",
    )


class DownloadAssembler:
    """A DownloadStream's messages, put back together: :meth:`add` each in
    turn, then :meth:`result`."""

    def __init__(self) -> None:
        self._handle: Optional[matmul_pb2.TensorHandle] = None
        self._data: Optional[bytearray] = None
        self._received = 0

    @staticmethod
    def _malformed(why: str) -> MatmulError:
        return MatmulError(grpc.StatusCode.INTERNAL, f"the server's DownloadStream is malformed: {why}")

    @property
    def started(self) -> bool:
        """Whether the first message (the handle) has come."""
        return self._handle is not None

    def add(self, response: matmul_pb2.DownloadStreamResponse) -> None:
        kind = response.WhichOneof("kind")
        if self._handle is None:
            if kind != "handle":
                raise self._malformed("its first message is not the handle")
            if response.handle.bytes < 0:
                raise self._malformed(f"a handle of {response.handle.bytes} bytes")
            self._handle = response.handle
            self._data = bytearray(response.handle.bytes)
            return
        if kind != "chunk":
            raise self._malformed("a second handle")
        assert self._data is not None
        data = response.chunk.data
        if response.chunk.offset != self._received or len(data) > len(self._data) - self._received:
            raise self._malformed(
                f"a chunk of {len(data)} bytes at offset {response.chunk.offset} after "
                f"{self._received} of {len(self._data)} bytes"
            )
        self._data[self._received : self._received + len(data)] = data
        self._received += len(data)

    def result(self) -> np.ndarray:
        """The tensor, decoded as Download's is."""
        if self._handle is None or self._data is None or self._received != len(self._data):
            raise self._malformed(
                f"it ended after {self._received} of {0 if self._data is None else len(self._data)} bytes"
            )
        name = DTYPE_NAMES.get(self._handle.dtype)
        if name is None:
            raise MatmulError(grpc.StatusCode.INTERNAL, f"the server sent a tensor of unknown dtype {self._handle.dtype}")
        data, self._data = self._data, None
        return stored_wire_type(name).from_wire(data).reshape(tuple(self._handle.shape))
