"""Between the clients and the native core (``matmul_client._native``, over
the C++ client library): whether it imports, the native client of a target
and channel settings, the clients' arguments converted into its calls, and
its results and errors back into the package's arrays, Handles and
MatmulErrors. Used by Client and AsyncClient alike."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

from ._channel import DEFAULT_OPTIONS, ChannelOption, TlsArgument, channel_options, tls_config
from ._errors import _STATUS_CODES, MatmulError
from ._handles import Handle, ttl_seconds
from ._requests import _COMPUTE_MODES, Operand, _multiply_operands
from ._tensors import (
    DTYPE_NAMES,
    WireType,
    resolve_single_wire_type,
    stored_wire_type,
    to_wire_array,
)

#: The environment variable that, set to "0", keeps every Client on the
#: pure-Python path even where the native module imports.
NATIVE_ENV = "MATMUL_CLIENT_NATIVE"

_native: Any
#: Why the native module is not used (None when it is).
NATIVE_UNAVAILABLE: Optional[str]
if os.environ.get(NATIVE_ENV, "1") == "0":
    _native, NATIVE_UNAVAILABLE = None, f"{NATIVE_ENV}=0"
else:
    try:
        from . import _native
    except ImportError as _error:  # Not built, or built for another Python.
        _native, NATIVE_UNAVAILABLE = None, f"matmul_client._native does not import: {_error}"
    else:
        NATIVE_UNAVAILABLE = None


def _native_result_dtype(wire: WireType) -> np.dtype:
    """The dtype the native core returns a product of ``wire`` in: the
    little-endian element type (bfloat16 as its uint16 bits)."""
    if wire.name == "bfloat16":
        return np.dtype("<u2")
    return np.dtype(wire.name).newbyteorder("<")


def _native_error(error: Exception) -> MatmulError:
    """The MatmulError of a native StatusError(code, message)."""
    code, message = error.args
    return MatmulError(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


def _native_status(code: int, message: str) -> MatmulError:
    """The MatmulError of a native (code, message)."""
    return MatmulError(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


def _float_or_none(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else float(seconds)


def _native_options(
    tls: TlsArgument, options: Sequence[ChannelOption]
) -> Tuple[Dict[str, Any], Optional[str]]:
    """The native Client's keyword arguments for ``tls`` and ``options``
    (channel options as the pure-Python channel gets them), or why the
    native core cannot take them."""
    config = tls_config(tls)
    kwargs: Dict[str, Any] = {"load_balancing_policy": "round_robin", "tls": config is not None}
    if config is not None:
        kwargs.update(
            root_certificates=config.root_certificates,
            private_key=config.private_key,
            certificate_chain=config.certificate_chain,
        )
    defaults = dict(DEFAULT_OPTIONS)
    ints: List[Tuple[str, int]] = []
    strings: List[Tuple[str, str]] = []
    for key, value in channel_options(options, config):
        if defaults.get(key, _MISSING) == value:
            continue  # The C++ library's own defaults (unlimited sizes, round_robin).
        if key == "grpc.service_config":
            kwargs["load_balancing_policy"] = ""  # The caller's config instead.
        if isinstance(value, (bool, int, np.integer)) and -(2**31) <= int(value) < 2**31:
            ints.append((str(key), int(value)))
        elif isinstance(value, str):
            strings.append((str(key), value))
        elif isinstance(value, bytes):
            strings.append((str(key), value.decode("latin-1")))
        else:
            return {}, f"channel option {key!r} has a {type(value).__name__} value"
    kwargs.update(int_options=ints, string_options=strings)
    return kwargs, None


_MISSING = object()


def _make_native(
    target: str, tls: TlsArgument, options: Sequence[ChannelOption], client_id: Optional[str]
) -> Tuple[Any, Optional[str]]:
    """A native client of ``target`` with these settings, or (None, why not)."""
    if NATIVE_UNAVAILABLE is not None:
        return None, NATIVE_UNAVAILABLE
    kwargs, why = _native_options(tls, options)
    if why is not None:
        return None, why
    try:
        return _native.Client(target, client_id=client_id or "", **kwargs), None
    except _native.StatusError as error:
        raise _native_error(error) from None


def _native_args(
    a: Operand, b: Operand, transpose_a: bool, transpose_b: bool, compute: str, dtype: Any,
    keep: bool, result_ttl: Optional[float], timeout: Optional[float],
) -> Tuple[Tuple[Any, ...], WireType]:
    """Validates a multiply's arguments into the native core's: each array
    operand in wire form (itself when it already is, else one copy), each
    stored one as its handle id."""
    arrays, handles, ttl, wire = _multiply_operands(a, b, compute, dtype, keep, result_ttl)
    operands: List[Any] = []
    flags = []
    for name, transpose in (("a", transpose_a), ("b", transpose_b)):
        if name in handles:
            operands.append((None, wire.proto, handles[name].id))
            flags.append(bool(transpose))
        else:
            x, flag = to_wire_array(arrays[name], wire, bool(transpose))
            operands.append((x, wire.proto, ""))
            flags.append(flag)
    args = (
        *operands[0], *operands[1], flags[0], flags[1], _COMPUTE_MODES[compute],
        _float_or_none(timeout), None if keep else _native_result_dtype(wire), bool(keep), ttl,
    )
    return args, wire


def _native_array(product: np.ndarray, wire: WireType) -> np.ndarray:
    """A product array from the native core in the caller's dtype."""
    if wire.name == "bfloat16":
        return wire.from_wire(product).reshape(product.shape)
    if not product.dtype.isnative:  # A big-endian host.
        return product.astype(product.dtype.newbyteorder("="))
    return product


def _native_upload_args(
    x: np.ndarray, dtype: Any, device: Optional[int], ttl: Optional[float], timeout: Optional[float],
    near: str = "",
) -> Tuple[Any, ...]:
    """Validates upload's arguments into the native core's (``near``: a
    handle id, or "")."""
    wire = resolve_single_wire_type(x, dtype, "array")
    values = np.ascontiguousarray(wire.to_wire(x))
    return (
        values, wire.proto, -1 if device is None else int(device), ttl_seconds(ttl, "ttl"),
        _float_or_none(timeout), near,
    )


def _handle_from_native(value: Tuple[Any, ...], client: Any) -> Handle:
    """The Handle of a native stored-tensor tuple."""
    ident, shape, dtype, device, size, expire_ms = value
    return Handle(
        id=ident,
        shape=tuple(shape),
        dtype=DTYPE_NAMES.get(dtype, f"unknown dtype {dtype}"),
        device=device,
        bytes=size,
        expires=expire_ms / 1000.0,
        _client=client,
    )


def _downloaded(value: Tuple[np.ndarray, int]) -> np.ndarray:
    """A native download's (array, dtype) as the caller gets it."""
    array, dtype = value
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise MatmulError(grpc.StatusCode.INTERNAL, f"the server sent a tensor of unknown dtype {dtype}")
    return _native_array(array, stored_wire_type(name))
