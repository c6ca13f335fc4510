"""The exception every failed RPC raises, and gRPC's status codes by number
(the native core and MultiplyStream's error messages carry numbers)."""

from __future__ import annotations

import grpc

#: grpc.StatusCode by its numeric value (google.rpc.Code).
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class MatmulError(Exception):
    """A call to the matmul server failed.

    Attributes:
        code: The gRPC status code, e.g. ``grpc.StatusCode.INVALID_ARGUMENT``.
        details: The server's (or gRPC's) message explaining why.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"

    @classmethod
    def from_call(cls, call: grpc.Call) -> "MatmulError":
        """The error of a finished, failed gRPC call (or ``grpc.RpcError``)."""
        return cls(call.code(), call.details() or "")
