#!/usr/bin/env python3
"""check_server: what matmul-bench does not exercise in a comparison server.

Sends transposed and non-square float32 multiplies to --target and compares
the products with numpy's (float64 reference), then sends requests each
server must refuse and checks the exact status code. Prints one line per
case and "N passed, N failed"; exits non-zero on a failure. Needs grpcio,
protobuf and numpy, and the stubs of the bench/compare build (--stubs).

  bench/compare/check_server.py --target 127.0.0.1:50071
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_DEFAULT_STUBS = Path(__file__).resolve().parents[2] / "build" / "compare" / "python"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--stubs", default=str(_DEFAULT_STUBS))
    args = p.parse_args()
    sys.path.insert(0, args.stubs)
    import grpc
    import numpy as np
    from matmul.v1 import matmul_pb2 as pb2
    from matmul.v1 import matmul_pb2_grpc as pb2_grpc

    channel = grpc.insecure_channel(args.target, options=[("grpc.max_receive_message_length", -1)])
    stub = pb2_grpc.MatmulServiceStub(channel)
    rng = np.random.default_rng(7)
    passed = failed = 0

    def report(ok: bool, what: str) -> None:
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    def tensor(x):
        return pb2.Tensor(shape=list(x.shape), dtype=pb2.DTYPE_FLOAT32, data=x.astype(np.float32).tobytes())

    info = stub.GetServerInfo(pb2.GetServerInfoRequest(), timeout=30)
    print(f"engine {info.engine}, {info.version}, devices {[d.name for d in info.devices]}")

    for m, k, n in ((33, 17, 65), (1, 128, 1), (300, 200, 100)):
        for ta in (False, True):
            for tb in (False, True):
                a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
                b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
                want = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
                what = f"{m}x{k}x{n} transpose_a={ta} transpose_b={tb}"
                try:
                    r = stub.Multiply(pb2.MultiplyRequest(a=tensor(a), b=tensor(b), transpose_a=ta,
                                                          transpose_b=tb), timeout=30)
                except grpc.RpcError as e:
                    report(False, f"{what}: {e.code().name}: {e.details()}")
                    continue
                got = np.frombuffer(r.c.data, dtype=np.float32)
                ok = list(r.c.shape) == [m, n] and got.size == m * n
                err = float(np.max(np.abs(got.reshape(m, n) - want))) if ok else float("inf")
                report(ok and err <= 1e-4 * np.sqrt(k) * max(1.0, float(np.max(np.abs(want)))),
                       f"{what}: shape {list(r.c.shape)}, max error {err:.3g}")

    a = tensor(np.ones((4, 8)))
    b = tensor(np.ones((8, 2)))
    refusals = [
        ("inner dimensions differ", pb2.MultiplyRequest(a=a, b=a), "INVALID_ARGUMENT"),
        ("data shorter than its shape",
         pb2.MultiplyRequest(a=pb2.Tensor(shape=[4, 8], dtype=pb2.DTYPE_FLOAT32, data=b"\0" * 4), b=b),
         "INVALID_ARGUMENT"),
        ("dtype unset", pb2.MultiplyRequest(a=pb2.Tensor(shape=[4, 8], data=a.data), b=b), "INVALID_ARGUMENT"),
        ("b missing", pb2.MultiplyRequest(a=a), "INVALID_ARGUMENT"),
        ("1-D operand", pb2.MultiplyRequest(a=pb2.Tensor(shape=[32], dtype=pb2.DTYPE_FLOAT32, data=a.data), b=b),
         "INVALID_ARGUMENT"),
        ("float64", pb2.MultiplyRequest(
            a=pb2.Tensor(shape=[4, 8], dtype=pb2.DTYPE_FLOAT64, data=b"\0" * 256),
            b=pb2.Tensor(shape=[8, 2], dtype=pb2.DTYPE_FLOAT64, data=b"\0" * 128)), "UNIMPLEMENTED"),
        ("3-D operand", pb2.MultiplyRequest(
            a=pb2.Tensor(shape=[1, 4, 8], dtype=pb2.DTYPE_FLOAT32, data=a.data), b=b), "UNIMPLEMENTED"),
        ("a_handle", pb2.MultiplyRequest(a_handle="x", b=b), "UNIMPLEMENTED"),
        ("keep_result", pb2.MultiplyRequest(a=a, b=b, keep_result=True), "UNIMPLEMENTED"),
    ]
    for what, req, code in refusals:
        try:
            stub.Multiply(req, timeout=30)
            report(False, f"{what}: answered OK, want {code}")
        except grpc.RpcError as e:
            report(e.code().name == code, f"{what}: {e.code().name} ({e.details()})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
