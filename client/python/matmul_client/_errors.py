"""The exception every failed RPC raises, and gRPC's status codes by number
(the native core and MultiplyStream's error messages carry numbers)."""

from __future__ import annotations

import warnings
from typing import Any, Optional

import grpc

#: grpc.StatusCode by its numeric value (google.rpc.Code).
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class _CodeAttribute:
    """What ``MatmulError.code`` is: called, the ``grpc.StatusCode``, as on
    every ``grpc.RpcError``; used as the attribute it was before (compared
    with ``==`` or ``in``, a dict key, ``.name``, ``.value``), the same code,
    with a DeprecationWarning. ``error.code is grpc.StatusCode.X`` cannot be
    kept: it is False now, use ``error.code() is ...``."""

    __slots__ = ("_code",)

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def __call__(self) -> grpc.StatusCode:
        return self._code

    def _deprecated(self) -> grpc.StatusCode:
        warnings.warn(
            "MatmulError.code is a method, as on grpc.RpcError: use error.code()",
            DeprecationWarning,
            stacklevel=3,
        )
        return self._code

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _CodeAttribute):
            other = other._code
        return self._deprecated() == other

    def __hash__(self) -> int:
        return hash(self._deprecated())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_code":  # copy, pickle: not the code's
            raise AttributeError(name)
        return getattr(self._deprecated(), name)

    def __repr__(self) -> str:
        return repr(self._code)

    def __str__(self) -> str:
        return str(self._code)


class _DetailsAttribute(str):
    """What ``MatmulError.details`` is: the message, a ``str`` as it was
    before, that called (``error.details()``, as on every ``grpc.RpcError``)
    returns itself as a plain ``str``."""

    __slots__ = ()

    def __call__(self) -> str:
        return str(self)


class MatmulError(grpc.RpcError):
    """A call to the matmul server failed.

    A ``grpc.RpcError``: code written for grpcio (``except grpc.RpcError as
    e: e.code(), e.details()``) handles it. The AsyncClient raises it too
    (not ``grpc.aio.AioRpcError``, which is a ``grpc.RpcError`` as well).

    Methods, as on ``grpc.RpcError``:
        code(): The gRPC status code, e.g. ``grpc.StatusCode.INVALID_ARGUMENT``.
        details(): The server's (or gRPC's, or the client's) message: why.
        initial_metadata(), trailing_metadata(), debug_error_string(): those
            of the failed gRPC call, asked of it when called (grpc blocks
            for some of them, as on its own errors); None where there was
            none (the native core, or a refusal by the client itself).

    Read as attributes, as before they were methods, ``.details`` is still
    the message string and ``.code`` still compares equal to the code
    (deprecated: call ``code()``); only ``error.code is X`` no longer holds,
    ``error.code() is X`` does. ``args`` is ``(code, details)``.
    """

    def __init__(
        self, code: grpc.StatusCode, details: str, *, call: Optional[Any] = None
    ) -> None:
        """``call``: the failed gRPC call this error stands for, if any.
        Its metadata is not copied here: grpc would block for some of it
        (a locally cancelled streaming call never gets a debug string)."""
        super().__init__(code, details)
        self._code = code
        self._details = details
        self._call = call

    @property
    def code(self) -> _CodeAttribute:
        """``code()``: the ``grpc.StatusCode``."""
        return _CodeAttribute(self._code)

    @property
    def details(self) -> _DetailsAttribute:
        """``details()`` (or ``details``): the message."""
        return _DetailsAttribute(self._details)

    def initial_metadata(self) -> Optional[Any]:
        return None if self._call is None else self._call.initial_metadata()

    def trailing_metadata(self) -> Optional[Any]:
        return None if self._call is None else self._call.trailing_metadata()

    def debug_error_string(self) -> Optional[str]:
        return None if self._call is None else self._call.debug_error_string()

    def __reduce__(self) -> Any:
        return type(self), (self._code, self._details)  # Not the call: it does not pickle.

    def __str__(self) -> str:
        return f"{self._code.name}: {self._details}"

    @classmethod
    def from_call(cls, call: grpc.Call) -> "MatmulError":
        """The error of a finished, failed gRPC call (its ``grpc.RpcError``,
        or a finished ``grpc.Future``)."""
        return cls(call.code(), call.details() or "", call=call)
