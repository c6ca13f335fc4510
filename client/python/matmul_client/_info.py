"""What GetServerInfo reports, as plain dataclasses."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Tuple, Type, TypeVar

from ._proto.matmul.v1 import matmul_pb2
from ._tensors import DTYPE_NAMES

_T = TypeVar("_T")


def _from_message(cls: Type[_T], message: Any) -> _T:
    """Builds dataclass ``cls`` from the message fields of the same names."""
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Device:
    """One compute device of the server (for the host engine: its CPU)."""

    index: int  #: Index in Placement and metrics labels; -1 for the host.
    name: str  #: e.g. "NVIDIA H200", or the CPU's name.
    uuid: str  #: GPU UUID; empty for the host.
    memory_bytes: int  #: Device memory; 0 for the host.
    multiprocessors: int  #: Streaming multiprocessors, or CPU cores.
    copy_engines: int  #: Asynchronous copy engines; 0 for the host.
    compute_capability: str  #: "major.minor"; empty for the host.
    staging_bytes: int  #: Pinned staging memory for this device.


@dataclass(frozen=True)
class Limits:
    """Bounds a request must stay within; beyond them the server answers
    RESOURCE_EXHAUSTED."""

    max_message_bytes: int
    max_elements_per_operand: int
    max_inflight_bytes: int
    max_dimension: int
    max_stored_bytes_per_client: int  #: Bytes of stored tensors one client may hold.
    max_handles_per_client: int  #: Stored tensors one client may hold.
    default_handle_ttl_seconds: int  #: Lifetime of a stored tensor given no ttl.
    max_handle_ttl_seconds: int  #: Longest ttl a call may ask for.
    max_stored_bytes: int = 0  #: Bytes of stored tensors all clients together may hold.


@dataclass(frozen=True)
class ServerInfo:
    """The server's engine, devices, dtypes and limits."""

    engine: str  #: "cuda" or "host".
    version: str
    devices: Tuple[Device, ...]
    streams_per_device: int
    dtypes: Tuple[str, ...]  #: e.g. ("float32", "float64", "float16", "bfloat16").
    limits: Limits

    @classmethod
    def from_proto(cls, response: matmul_pb2.GetServerInfoResponse) -> "ServerInfo":
        """Converts a GetServerInfoResponse."""
        return cls(
            engine=response.engine,
            version=response.version,
            devices=tuple(_from_message(Device, d) for d in response.devices),
            streams_per_device=response.streams_per_device,
            dtypes=tuple(DTYPE_NAMES.get(d, f"unknown dtype {d}") for d in response.dtypes),
            limits=_from_message(Limits, response.limits),
        )
