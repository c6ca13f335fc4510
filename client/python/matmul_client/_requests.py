"""A multiply's arguments checked and encoded: which operands are arrays and
which stored tensors, the dtype they travel in (:class:`WireType`), and the
``MultiplyRequest`` of the unary Multiply (which MultiplyStream carries too).
Both engines of :class:`~matmul_client.Client` and
:class:`~matmul_client.aio.AsyncClient` start here."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

from ._handles import Handle, handle_id, ttl_seconds
from ._proto.matmul.v1 import matmul_pb2
from ._tensors import (
    BFLOAT16_DTYPE,
    WireType,
    check_convertible,
    own_wire_type,
    resolve_wire_type,
    stored_wire_type,
    to_tensor,
    wire_type_argument,
)

#: An operand: an array (anything numpy.asarray takes) or a stored tensor.
Operand = Union[npt.ArrayLike, Handle]

_COMPUTE_MODES = {
    "strict": matmul_pb2.COMPUTE_MODE_STRICT,
    "tf32": matmul_pb2.COMPUTE_MODE_TF32,
}


def _operand_wire_type(operands: Dict[str, Any], handles: Dict[str, Handle], dtype: Any) -> WireType:
    """How a multiply with at least one stored operand travels: stored
    tensors keep their dtype, which every operand must share."""
    names = {h.dtype for h in handles.values()}
    if len(names) > 1:
        raise TypeError(
            "a and b are stored tensors of different dtypes ("
            + " and ".join(f"{n}: {h.dtype}" for n, h in handles.items())
            + "); both operands must have the same dtype"
        )
    (stored,) = names
    if dtype is not None:
        wire = wire_type_argument(dtype)
        if wire.name != stored:
            raise TypeError(
                f"dtype={dtype!r}, but the stored operand is {stored}; a stored tensor keeps its dtype"
            )
        for name, x in operands.items():
            check_convertible(name, x, wire)
        return wire
    if not operands:
        return stored_wire_type(stored)
    ((name, x),) = operands.items()
    other = "b" if name == "a" else "a"
    if stored == "bfloat16":
        if BFLOAT16_DTYPE is not None and np.dtype(x.dtype.type) == BFLOAT16_DTYPE:
            return own_wire_type(name, x)
        raise TypeError(
            f"{name} is {x.dtype} and {other} is a stored bfloat16 tensor; pass dtype='bfloat16' "
            f"to round {name} to bfloat16 (the result is then float32)"
        )
    wire = own_wire_type(name, x)
    if wire.name != stored:
        raise TypeError(
            f"{name} is {x.dtype} and {other} is a stored {stored} tensor; both operands must have "
            f"the same dtype (convert {name}, or pass dtype=numpy.{stored})"
        )
    return wire


def _multiply_operands(
    a: Operand,
    b: Operand,
    compute: str,
    dtype: Any,
    keep: bool = False,
    result_ttl: Optional[float] = None,
) -> Tuple[Dict[str, np.ndarray], Dict[str, Handle], int, WireType]:
    """Validates a Multiply call's arguments: the array operands, the stored
    ones, the result TTL in seconds and the wire type."""
    handles: Dict[str, Handle] = {}
    arrays: Dict[str, np.ndarray] = {}
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, Handle):
            handle_id(x, name)
            handles[name] = x
            continue
        array = np.asarray(x)
        if array.ndim not in (2, 3):
            raise ValueError(
                f"{name} has {array.ndim} dimension(s) (shape {array.shape}); the service takes "
                f"2-D [rows, cols] or 3-D [batch, rows, cols] operands "
                f"(make a vector v a matrix with v[None, :] or v[:, None])"
            )
        arrays[name] = array
    if compute not in _COMPUTE_MODES:
        raise ValueError(f"compute={compute!r}: expected one of {sorted(_COMPUTE_MODES)}")
    if not keep and result_ttl is not None:
        raise ValueError("result_ttl applies only with keep=True")
    ttl = ttl_seconds(result_ttl, "result_ttl") if keep else 0
    if handles:
        wire = _operand_wire_type(arrays, handles, dtype)
    else:
        wire = resolve_wire_type(arrays["a"], arrays["b"], dtype)
    return arrays, handles, ttl, wire


def _multiply_request(
    a: Operand,
    b: Operand,
    transpose_a: bool,
    transpose_b: bool,
    compute: str,
    dtype: Any,
    keep: bool = False,
    result_ttl: Optional[float] = None,
) -> Tuple[matmul_pb2.MultiplyRequest, WireType]:
    """Validates and encodes a Multiply call's arguments."""
    arrays, handles, ttl, wire = _multiply_operands(a, b, compute, dtype, keep, result_ttl)
    request = matmul_pb2.MultiplyRequest(
        compute_mode=_COMPUTE_MODES[compute], keep_result=bool(keep), result_ttl_seconds=ttl
    )
    transposes = {"a": bool(transpose_a), "b": bool(transpose_b)}
    for name in ("a", "b"):
        if name in handles:
            setattr(request, f"{name}_handle", handles[name].id)
            continue
        tensor, transposes[name] = to_tensor(arrays[name], wire, transposes[name])
        getattr(request, name).CopyFrom(tensor)
    request.transpose_a = transposes["a"]
    request.transpose_b = transposes["b"]
    return request, wire
