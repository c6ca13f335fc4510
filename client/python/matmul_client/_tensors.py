"""NumPy arrays to and from ``matmul.v1.Tensor`` messages, and bfloat16 rounding.

Elements travel as raw little-endian bytes in row-major order. Which dtype a
request travels in is a :class:`WireType`, chosen by :func:`resolve_wire_type`
from the operands' dtypes and the caller's ``dtype`` argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import numpy.typing as npt

from ._proto.matmul.v1 import matmul_pb2

try:
    import ml_dtypes
except ImportError:  # Optional: only needed for ml_dtypes.bfloat16 arrays.
    ml_dtypes = None

#: NumPy dtype of ``ml_dtypes.bfloat16`` when ml_dtypes is importable, else None.
BFLOAT16_DTYPE: Optional[np.dtype] = (
    np.dtype(ml_dtypes.bfloat16) if ml_dtypes is not None else None
)


def float32_to_bfloat16_bits(x: npt.ArrayLike) -> np.ndarray:
    """Rounds float32 values to bfloat16, returning the bit patterns as uint16.

    Rounds to nearest, ties to even, as hardware does: values beyond the
    largest bfloat16 become infinities, NaNs stay (quiet) NaNs with their sign.
    Vectorised; the input is converted to float32 first.
    """
    values = np.asarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    with np.errstate(over="ignore"):  # NaN bit patterns may wrap; masked below.
        rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x0040)
    return np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)


def bfloat16_bits_to_float32(bits: npt.ArrayLike) -> np.ndarray:
    """Widens bfloat16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


@dataclass(frozen=True)
class WireType:
    """How arrays of one dtype travel.

    Attributes:
        name: The dtype's name in messages ("float32", "bfloat16", ...).
        proto: The ``matmul.v1.Dtype`` value.
        to_wire: Converts an operand to an array of the wire's little-endian
            element type (any memory layout).
        from_wire: Turns a result's raw bytes into a flat, writable array in
            the dtype the caller gets back.
    """

    name: str
    proto: int
    to_wire: Callable[[np.ndarray], np.ndarray]
    from_wire: Callable[[bytes], np.ndarray]


def _ieee_wire_type(dtype: npt.DTypeLike, proto: int) -> WireType:
    native = np.dtype(dtype)
    little = native.newbyteorder("<")
    return WireType(
        name=native.name,
        proto=proto,
        to_wire=lambda x: x.astype(little, copy=False),
        from_wire=lambda data: np.frombuffer(data, dtype=little).astype(native),
    )


_WIRE_BY_DTYPE: Dict[np.dtype, WireType] = {
    np.dtype(np.float32): _ieee_wire_type(np.float32, matmul_pb2.DTYPE_FLOAT32),
    np.dtype(np.float64): _ieee_wire_type(np.float64, matmul_pb2.DTYPE_FLOAT64),
    np.dtype(np.float16): _ieee_wire_type(np.float16, matmul_pb2.DTYPE_FLOAT16),
}

if BFLOAT16_DTYPE is not None:
    _bf16: np.dtype = BFLOAT16_DTYPE
    _WIRE_BY_DTYPE[_bf16] = WireType(
        name="bfloat16",
        proto=matmul_pb2.DTYPE_BFLOAT16,
        to_wire=lambda x: x.astype(_bf16, copy=False).view(np.uint16).astype("<u2", copy=False),
        from_wire=lambda data: np.frombuffer(data, dtype="<u2").astype(np.uint16).view(_bf16),
    )

#: dtype="bfloat16": operands rounded to bfloat16 in NumPy, results widened to
#: float32 (exactly). Works without ml_dtypes.
_BFLOAT16_VIA_FLOAT32 = WireType(
    name="bfloat16",
    proto=matmul_pb2.DTYPE_BFLOAT16,
    to_wire=lambda x: float32_to_bfloat16_bits(x).astype("<u2", copy=False),
    from_wire=lambda data: bfloat16_bits_to_float32(np.frombuffer(data, dtype="<u2")),
)

_SUPPORTED = "float32, float64, float16 or bfloat16"

#: Dtype names for GetServerInfo's dtypes, by ``matmul.v1.Dtype`` value.
DTYPE_NAMES: Dict[int, str] = {
    matmul_pb2.DTYPE_FLOAT32: "float32",
    matmul_pb2.DTYPE_FLOAT64: "float64",
    matmul_pb2.DTYPE_FLOAT16: "float16",
    matmul_pb2.DTYPE_BFLOAT16: "bfloat16",
}

#: How a stored tensor of each dtype comes back when its wire type is not
#: otherwise known (download, a product of two stored operands): in its own
#: dtype, except bfloat16, which NumPy lacks, widened to float32 (exactly).
_WIRE_BY_NAME: Dict[str, WireType] = {
    "float32": _WIRE_BY_DTYPE[np.dtype(np.float32)],
    "float64": _WIRE_BY_DTYPE[np.dtype(np.float64)],
    "float16": _WIRE_BY_DTYPE[np.dtype(np.float16)],
    "bfloat16": _BFLOAT16_VIA_FLOAT32,
}


def stored_wire_type(dtype_name: str) -> WireType:
    """The wire type a stored tensor of dtype ``dtype_name`` ("float32", ...)
    is decoded with; bfloat16 decodes to float32."""
    try:
        return _WIRE_BY_NAME[dtype_name]
    except KeyError:
        raise TypeError(f"unknown stored dtype {dtype_name!r}") from None


def _canonical(dtype: np.dtype) -> np.dtype:
    """The dtype in native byte order ('>f4' and '<f4' are both float32)."""
    return np.dtype(dtype.type)


def resolve_wire_type(a: np.ndarray, b: np.ndarray, dtype: Any) -> WireType:
    """Chooses how a request's operands travel.

    Args:
        a: Left operand.
        b: Right operand.
        dtype: None to use the operands' own dtype, which must be the same
            supported dtype for both; "bfloat16" to round both to bfloat16 and
            get float32 results; or a NumPy dtype (float32, float64, float16,
            ml_dtypes.bfloat16) to convert both operands to.

    Raises:
        TypeError: The dtypes are unsupported, differ, or cannot be converted.
    """
    if dtype is None:
        for name, x in (("a", a), ("b", b)):
            if _canonical(x.dtype) not in _WIRE_BY_DTYPE:
                raise TypeError(
                    f"{name} has dtype {x.dtype}; the service multiplies {_SUPPORTED} "
                    f"(pass dtype=... to convert, e.g. dtype=numpy.float32)"
                )
        if _canonical(a.dtype) != _canonical(b.dtype):
            raise TypeError(
                f"a is {a.dtype} and b is {b.dtype}; both operands must have the same "
                f"dtype (convert one, or pass dtype=... to convert both)"
            )
        return _WIRE_BY_DTYPE[_canonical(a.dtype)]

    wire = wire_type_argument(dtype)
    for name, x in (("a", a), ("b", b)):
        check_convertible(name, x, wire)
    return wire


def wire_type_argument(dtype: Any) -> WireType:
    """The wire type a (non-None) ``dtype=`` argument asks for."""
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _BFLOAT16_VIA_FLOAT32
    try:
        return _WIRE_BY_DTYPE[_canonical(np.dtype(dtype))]
    except (TypeError, KeyError):
        raise TypeError(
            f"dtype={dtype!r}: expected None, 'bfloat16', numpy.float32, numpy.float64 "
            f"or numpy.float16" + (" or ml_dtypes.bfloat16" if BFLOAT16_DTYPE is not None else "")
        ) from None


def check_convertible(name: str, x: np.ndarray, wire: WireType) -> None:
    """Raises TypeError unless ``x`` converts to ``wire``'s dtype."""
    if x.dtype.kind not in "biuf" and _canonical(x.dtype) != BFLOAT16_DTYPE:
        raise TypeError(f"{name} has dtype {x.dtype}, which does not convert to {wire.name}")


def own_wire_type(name: str, x: np.ndarray) -> WireType:
    """The wire type of an array that travels in its own dtype."""
    try:
        return _WIRE_BY_DTYPE[_canonical(x.dtype)]
    except KeyError:
        raise TypeError(
            f"{name} has dtype {x.dtype}; the service takes {_SUPPORTED} "
            f"(pass dtype=... to convert, e.g. dtype=numpy.float32)"
        ) from None


def resolve_single_wire_type(x: np.ndarray, dtype: Any, name: str) -> WireType:
    """How one array travels (Upload): in its own dtype when ``dtype`` is None,
    else converted as ``dtype`` says (see :func:`resolve_wire_type`)."""
    if dtype is None:
        return own_wire_type(name, x)
    wire = wire_type_argument(dtype)
    check_convertible(name, x, wire)
    return wire


def to_wire_array(x: np.ndarray, wire: WireType, transpose: bool) -> Tuple[np.ndarray, bool]:
    """Operand ``x`` (2-D or 3-D) as a C-contiguous little-endian array of
    the wire's element type: ``x`` itself when it already is one, else one
    copy (a non-contiguous, big-endian or differently typed array).

    A matrix stored column-major (e.g. ``m.T`` of a row-major ``m``) is sent
    as its row-major transpose with the transpose flag flipped, which saves a
    copy. Returns the array and the transpose flag to send with it.
    """
    values = wire.to_wire(x)
    if not values.flags.c_contiguous:
        swapped = np.swapaxes(values, -1, -2)
        if swapped.flags.c_contiguous:
            values, transpose = swapped, not transpose
    return np.ascontiguousarray(values), transpose


def to_tensor(x: np.ndarray, wire: WireType, transpose: bool) -> Tuple[matmul_pb2.Tensor, bool]:
    """Encodes operand ``x`` (2-D or 3-D) as a row-major little-endian tensor
    (:func:`to_wire_array`). Returns the tensor and the transpose flag to
    send with it.
    """
    values, transpose = to_wire_array(x, wire, transpose)
    tensor = matmul_pb2.Tensor(shape=values.shape, dtype=wire.proto, data=values.tobytes())
    return tensor, transpose


def encode_tensor(x: np.ndarray, wire: WireType) -> matmul_pb2.Tensor:
    """Encodes ``x`` as a row-major little-endian tensor, as it is (no
    transpose trick: a stored tensor has no transpose flag)."""
    values = np.ascontiguousarray(wire.to_wire(x))
    return matmul_pb2.Tensor(shape=values.shape, dtype=wire.proto, data=values.tobytes())


def from_tensor(tensor: matmul_pb2.Tensor, wire: WireType) -> np.ndarray:
    """Decodes a result tensor into a writable array of the caller's dtype."""
    return wire.from_wire(tensor.data).reshape(tuple(tensor.shape))
