"""Handle: a tensor stored on the server (Upload, or a product kept with keep=True).

This module does not import ``_client``: a Handle is bound to whatever it is
given that has ``download`` and ``delete`` (:class:`HandleOwner`), which is
a :class:`Client` in practice. ``_client`` imports this module, never the
other way round.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Tuple, Union

import grpc
import numpy as np

from ._errors import MatmulError
from ._proto.matmul.v1 import matmul_pb2
from ._tensors import DTYPE_NAMES


class HandleOwner(Protocol):
    """What a bound :class:`Handle` calls: the two methods of
    :class:`Client` that take a handle."""

    def download(self, handle: "HandleOrId", *, timeout: Optional[float] = None) -> np.ndarray: ...

    def delete(self, handle: "HandleOrId", *, timeout: Optional[float] = None) -> Any: ...


@dataclass(frozen=True)
class Handle:
    """A tensor stored on the server, named by ``id``.

    Pass it to :meth:`Client.multiply` as an operand instead of an array,
    fetch it with :meth:`download`, free it with :meth:`delete`. Unless
    deleted, the server frees it at ``expires``. Used as a context manager
    it is deleted when the block ends::

        with client.upload(a) as ha:
            c = client.multiply(ha, b)

    The id is a capability: whoever holds it may use or delete the tensor;
    its bytes count against the quota of the client that made it.

    Attributes:
        id: The server's handle id, opaque ("h1.<server>.<device>.<random>"
            names the server holding it, to which clients send the calls
            that use it; "h-..." names none).
        shape: (rows, cols) or (batch, rows, cols).
        dtype: "float32", "float64", "float16" or "bfloat16".
        device: The device it lives on (-1 on the host engine); multiplies
            that use it run there.
        bytes: Memory it occupies on the server (and is charged for).
        expires: When the server frees it unless deleted first, Unix time in
            seconds.
    """

    id: str
    shape: Tuple[int, ...]
    dtype: str
    device: int
    bytes: int
    expires: float
    _client: Optional[HandleOwner] = field(default=None, repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: matmul_pb2.TensorHandle, client: Optional[HandleOwner] = None) -> "Handle":
        """Converts a ``matmul.v1.TensorHandle``; ``client`` is what
        :meth:`download` and :meth:`delete` call."""
        return cls(
            id=message.id,
            shape=tuple(int(d) for d in message.shape),
            dtype=DTYPE_NAMES.get(message.dtype, f"unknown dtype {message.dtype}"),
            device=message.device,
            bytes=message.bytes,
            expires=message.expire_time_unix_ms / 1000.0,
            _client=client,
        )

    @property
    def ndim(self) -> int:
        """Number of dimensions (2 or 3)."""
        return len(self.shape)

    def download(self, *, timeout: Optional[float] = None) -> np.ndarray:
        """The stored data (see :meth:`Client.download`)."""
        return self._bound().download(self, timeout=timeout)

    def delete(self, *, timeout: Optional[float] = None) -> Any:
        """Frees the stored tensor (see :meth:`Client.delete`). Returns what
        the client's delete returns: None, or an awaitable for a handle of
        an :class:`~matmul_client.aio.AsyncClient`."""
        return self._bound().delete(self, timeout=timeout)

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        """Deletes the tensor. A tensor already gone (deleted, expired) is
        fine; another failure is raised unless the block is raising already."""
        try:
            self.delete()
        except MatmulError as error:
            if error.code() is grpc.StatusCode.NOT_FOUND or exc_type is not None:
                return
            raise
        except Exception:
            if exc_type is not None:
                return  # Do not mask the block's own exception.
            raise

    def _bound(self) -> HandleOwner:
        if self._client is None:
            raise ValueError(
                f"handle {self.id} is not bound to a client; call client.download(handle) "
                f"or client.delete(handle)"
            )
        return self._client


HandleOrId = Union[Handle, str]


def handle_id(handle: HandleOrId, name: str = "handle") -> str:
    """The id of a Handle or of an id string; ValueError/TypeError otherwise."""
    if isinstance(handle, Handle):
        value = handle.id
    elif isinstance(handle, str):
        value = handle
    else:
        raise TypeError(f"{name}: expected a Handle or a handle id string, got {type(handle).__name__}")
    if not value:
        raise ValueError(f"{name}: the handle id is empty")
    return value


def ttl_seconds(ttl: Optional[float], name: str) -> int:
    """A TTL argument as whole seconds for the API (rounded up); None is 0,
    the server's default."""
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, numbers.Real):
        raise TypeError(f"{name}: expected None or a number of seconds, got {type(ttl).__name__}")
    if not math.isfinite(float(ttl)) or ttl <= 0:
        raise ValueError(f"{name}: expected None (the server's default) or a positive number of seconds, got {ttl}")
    return int(math.ceil(float(ttl)))
