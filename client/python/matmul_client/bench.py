"""A load generator for the Python client, the counterpart of matmul-bench:

    python -m matmul_client.bench --target HOST:PORT [--shape N[,N...]]
        [--concurrency C[,C...]] [--duration S] [--warmup S]
        [--dtype float32|float64|float16] [--pure] [--streamed [--stripes K]] [--aio]
        [--clients K] [--timeout S] [--json FILE]

For each point (shape x concurrency), C Python threads share K Clients and
keep one multiply each in flight (closed loop) on prebuilt random N x N
operands, for --warmup seconds unrecorded, then --duration seconds recorded.
Prints one row per point: successful requests/s, payload GB/s (A and B out,
C back; 1 GB = 1e9 bytes), latency p50/p90/p99 of the successful requests,
and errors by gRPC code, as matmul-bench's table does. --pure runs the
pure-Python gRPC path (Client(native=False)); otherwise the native core,
which must import. --streamed uses multiply_streamed (--stripes K: each
multiply striped over K MultiplyStream calls). --aio runs C asyncio
tasks on one event loop (one thread) with one matmul_client.aio.AsyncClient
instead of C threads (the "call" column says "aio").
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence

import numpy as np

from ._client import NATIVE_UNAVAILABLE, Client
from ._errors import MatmulError


def _positive_list(kind: type, text: str) -> List:
    values = [kind(part) for part in text.split(",") if part]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive comma-separated values")
    return values


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[index]


def run_point(
    clients: Sequence[Client],
    n: int,
    dtype: str,
    concurrency: int,
    duration: float,
    warmup: float,
    streamed: bool,
    timeout: float,
    seed: int = 1,
    stripes: int = 1,
) -> Dict:
    """One closed-loop point; returns its figures."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, n)).astype(dtype)
    b = rng.uniform(-1, 1, (n, n)).astype(dtype)
    itemsize = np.dtype(dtype).itemsize
    payload = 3 * n * n * itemsize
    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    errors: List[Counter] = [Counter() for _ in range(concurrency)]
    start = time.perf_counter()
    record_from = start + warmup
    stop_at = record_from + duration

    def worker(index: int) -> None:
        client = clients[index % len(clients)]
        call = client.multiply
        if streamed:
            call = functools.partial(client.multiply_streamed, stripes=stripes)
        mine, failed = latencies[index], errors[index]
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            try:
                call(a, b, timeout=timeout)
                ok = True
            except MatmulError as error:
                ok = False
                code = error.code().name
            t1 = time.perf_counter()
            if t0 >= record_from and t1 <= stop_at:
                if ok:
                    mine.append(t1 - t0)
                else:
                    failed[code] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = sorted(x for per_thread in latencies for x in per_thread)
    error_counts: Counter = Counter()
    for c in errors:
        error_counts.update(c)
    return {
        "shape": n,
        "dtype": dtype,
        "concurrency": concurrency,
        "requests": len(done),
        "req_per_s": len(done) / duration,
        "gb_per_s": len(done) * payload / duration / 1e9,
        "p50_ms": _percentile(done, 0.50) * 1e3,
        "p90_ms": _percentile(done, 0.90) * 1e3,
        "p99_ms": _percentile(done, 0.99) * 1e3,
        "errors": dict(error_counts),
    }


def run_point_aio(
    target: str,
    native: bool,
    n: int,
    dtype: str,
    concurrency: int,
    duration: float,
    warmup: float,
    timeout: float,
    seed: int = 1,
) -> Dict:
    """One closed-loop point of C tasks on one event loop sharing one
    AsyncClient; the same figures as :func:`run_point`."""
    import asyncio

    from .aio import AsyncClient

    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (n, n)).astype(dtype)
    b = rng.uniform(-1, 1, (n, n)).astype(dtype)
    payload = 3 * n * n * np.dtype(dtype).itemsize
    done: List[float] = []
    failed: Counter = Counter()

    async def point() -> None:
        async with AsyncClient(target, native=native) as client:
            start = time.perf_counter()
            record_from, stop_at = start + warmup, start + warmup + duration

            async def worker() -> None:
                while True:
                    t0 = time.perf_counter()
                    if t0 >= stop_at:
                        return
                    try:
                        await client.multiply(a, b, timeout=timeout)
                        code = None
                    except MatmulError as error:
                        code = error.code().name
                    t1 = time.perf_counter()
                    if t0 >= record_from and t1 <= stop_at:
                        if code is None:
                            done.append(t1 - t0)
                        else:
                            failed[code] += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(point())
    done.sort()
    return {
        "shape": n,
        "dtype": dtype,
        "concurrency": concurrency,
        "requests": len(done),
        "req_per_s": len(done) / duration,
        "gb_per_s": len(done) * payload / duration / 1e9,
        "p50_ms": _percentile(done, 0.50) * 1e3,
        "p90_ms": _percentile(done, 0.90) * 1e3,
        "p99_ms": _percentile(done, 0.99) * 1e3,
        "errors": dict(failed),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m matmul_client.bench",
        description="Closed-loop load on a matmul server through the Python client.",
    )
    parser.add_argument("--target", required=True, help="HOST:PORT or any gRPC target")
    parser.add_argument("--shape", type=lambda s: _positive_list(int, s), default=[1024],
                        help="N (N x N operands), comma-separated for several points (default 1024)")
    parser.add_argument("--concurrency", type=lambda s: _positive_list(int, s), default=[1],
                        help="threads, each with one call in flight; comma-separated sweep (default 1)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per point (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before each point, not recorded (default 1)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16"])
    parser.add_argument("--pure", action="store_true", help="the pure-Python gRPC path, not the native core")
    parser.add_argument("--streamed", action="store_true", help="multiply_streamed instead of multiply")
    parser.add_argument("--stripes", type=int, default=1,
                        help="with --streamed: MultiplyStream calls per multiply, 1 to 16 (default 1)")
    parser.add_argument("--aio", action="store_true",
                        help="asyncio tasks on one loop (matmul_client.aio) instead of threads")
    parser.add_argument("--clients", type=int, default=1, help="Client objects (channels) the threads share (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-call deadline, seconds (default 60)")
    parser.add_argument("--json", help="also write the points to this file")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or args.clients < 1:
        parser.error("--duration must be positive, --warmup not negative, --clients at least 1")
    if args.stripes != 1 and not args.streamed:
        parser.error("--stripes applies only with --streamed")
    if not 1 <= args.stripes <= 16:
        parser.error("--stripes takes 1 to 16")
    if args.aio and (args.streamed or args.clients != 1):
        parser.error("--aio runs multiply on one AsyncClient: no --streamed, no --clients")
    if not args.pure and NATIVE_UNAVAILABLE is not None:
        parser.error(f"the native core is not available ({NATIVE_UNAVAILABLE}); pass --pure")

    engine = "pure" if args.pure else "native"
    clients = [Client(args.target, native=not args.pure) for _ in range(args.clients)]
    points = []
    header = (f"{'engine':<7} {'call':<9} {'shape':>6} {'conc':>5} {'req/s':>9} {'GB/s':>7} "
              f"{'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9}  errors")
    print(header, flush=True)
    try:
        for n in args.shape:
            for c in args.concurrency:
                if args.aio:
                    point = run_point_aio(args.target, not args.pure, n, args.dtype, c,
                                          args.duration, args.warmup, args.timeout)
                else:
                    point = run_point(clients, n, args.dtype, c, args.duration, args.warmup,
                                      args.streamed, args.timeout, stripes=args.stripes)
                    point["stripes"] = args.stripes
                point["engine"] = engine
                point["call"] = "aio" if args.aio else "streamed" if args.streamed else "multiply"
                points.append(point)
                errors = ",".join(f"{k}:{v}" for k, v in sorted(point["errors"].items())) or "-"
                print(f"{engine:<7} {point['call']:<9} {n:>6} {c:>5} {point['req_per_s']:>9.1f} "
                      f"{point['gb_per_s']:>7.3f} {point['p50_ms']:>9.2f} {point['p90_ms']:>9.2f} "
                      f"{point['p99_ms']:>9.2f}  {errors}", flush=True)
    finally:
        for client in clients:
            client.close()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"points": points}, out, indent=2)
    return 0 if all(p["requests"] > 0 for p in points) else 1


if __name__ == "__main__":
    sys.exit(main())
