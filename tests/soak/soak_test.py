"""Soak: a real matmul-server under a mix of good and bad traffic, then checks.

For --soak-seconds (default $MATMUL_SOAK_SECONDS, else 60), WORKERS threads
spread over CONNECTIONS connections send, at random:

  valid      Client.multiply with random shapes (2-D, 3-D, broadcast batches),
             dtypes (float32, float64, float16, bfloat16), transposes and
             compute modes; every answer is checked against NumPy (float64
             reference, error bound from the dtype's arithmetic).
  invalid    hand-made MultiplyRequests that validation must refuse, each with
             the exact code it must get: INVALID_ARGUMENT (shapes, dtypes,
             byte counts, ...) or RESOURCE_EXHAUSTED (over the limits).
  cancelled  a larger float32 multiply, cancelled by the client after 0-30 ms.
  deadline   a larger float32 multiply with a 1-10 ms deadline.

Beside them, on connections of its own, a silent client opens one
MultiplyStream after another and sends chunks of 4 KiB for ids it never
started (each earns an error answer) without ever reading, for
SILENT_STREAM_SECONDS each, then cancels: the server must stop reading it
(flow control stalls its writes well before SILENT_STREAM_MESSAGES) and
forget it when cancelled. The server is stopped with three SIGTERMs.

The silent client's connections keep HTTP/2's initial receive window (no
BDP probing): a client that never reads then holds a fixed number of bytes
of answers, and what the server takes before its writes stall is a matter of
bytes (its kMaxUnsentReplies answers, the windows), not of how fast either
side runs. With BDP probing the client's own transport grows its window and
takes every answer, as fast as the server writes them: the count then only
measured the machine's speed (over 10,000 in 2 s on a loaded 2-core machine,
fewer on an idle one). test_silent_streams_beside_busy_cores checks the bound
with two CPU-bound processes beside the server, and that a client which does
take every answer into its transport costs the server no memory either.

A warm-up of the same mix comes first; its end is the baseline (RSS, metric
counters). Afterwards the test asserts:
  - no wrong answer (cancelled or deadline calls that still finished OK are
    checked too), and no code outside those each kind allows;
  - the server is up: health SERVING, and a final multiply is right;
  - RSS (VmRSS) is back below baseline + RSS_SLACK after a settle;
  - if /metrics answers: matmul_inflight_requests, matmul_inflight_bytes,
    matmul_queued_requests and matmul_pinned_bytes{state="used"} are back to 0,
    and matmul_requests_total{method="Multiply"} adds up to what the client
    saw (see check_request_counts for the exact rules);
  - the server exits 0 on SIGTERM (conftest.py).

The figures go to stdout and, if $MATMUL_SOAK_REPORT is set, to that JSON file.
$MATMUL_SOAK_ENGINE=cuda runs the server's CUDA engine instead of the host one.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import grpc
import numpy as np

import matmul_client
from matmul_client._proto.matmul.v1 import matmul_pb2, matmul_pb2_grpc

CONNECTIONS = 8
WORKERS = 16
# Share of each kind of call.
MIX = (("valid", 0.55), ("invalid", 0.20), ("cancelled", 0.15), ("deadline", 0.10))
# "Near the baseline" for RSS: allocator caches and gRPC's per-connection
# buffers move by a few MiB; a leak of one 256x256 float32 product per
# request would pass this within seconds.
RSS_SLACK_BYTES = int(os.environ.get("MATMUL_SOAK_RSS_SLACK_MIB", "64")) << 20
SETTLE_TIMEOUT_S = 20.0
# Deadline of every call that is not meant to time out.
GENEROUS_TIMEOUT_S = 60.0
# Hard bound on calls per worker, on top of the time bound.
MAX_CALLS_PER_WORKER = 1_000_000
# The silent client's streams: how long each is open, the most messages it
# offers, and how many of them the server may take before its writes stall
# (the stall comes after about 2,000 on loopback; 20,000 is 80 MiB of
# chunks, all read and their errors queued before the bound).
SILENT_STREAM_SECONDS = 2.0
SILENT_STREAM_MESSAGES = 20_000
SILENT_STREAM_MAX_TAKEN = 10_000
# How much the server's RSS may grow while a silent stream is open: its
# bounded answers and the HTTP/2 window of chunks its transport holds (a
# few MiB) are far under it; the 80 MiB of chunks that a server reading and
# holding everything would keep are over it.
SILENT_STREAM_RSS_SLACK_BYTES = 32 << 20

F32 = matmul_pb2.DTYPE_FLOAT32

# Unit roundoff of the arithmetic and of the result's rounding, by wire dtype.
_ARITHMETIC_UNIT = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
_TF32_UNIT = 2.0**-11
_OUTPUT_UNIT = {"float64": 0.0, "float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_OUTPUT_TINY = {"float64": 0.0, "float32": 0.0, "float16": 2.0**-25, "bfloat16": 2.0**-134}


# ---------------------------------------------------------------------------
# Requests and answers


def _op(x: np.ndarray, transpose: bool) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if transpose else x


def check_product(got: np.ndarray, a: np.ndarray, b: np.ndarray, transpose_a: bool,
                  transpose_b: bool, wire: str, compute: str = "strict") -> Optional[str]:
    """None if ``got`` is op(a)·op(b) within the dtype's error bound, else why not.

    ``a`` and ``b`` hold the values as they travelled (already rounded to the
    wire dtype). The bound is the classic one for a dot product of length k:
    |got - ref| <= 2(k+2)·u·(|op(a)|·|op(b)|) plus the rounding of the result
    to the output dtype.
    """
    a64 = _op(a.astype(np.float64), transpose_a)
    b64 = _op(b.astype(np.float64), transpose_b)
    want = np.matmul(a64, b64)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    expected_dtype = np.float32 if wire == "bfloat16" else np.dtype(wire)
    if got.dtype != expected_dtype:
        return f"dtype {got.dtype}, expected {np.dtype(expected_dtype)}"
    k = a64.shape[-1]
    scale = np.matmul(np.abs(a64), np.abs(b64))
    unit = _TF32_UNIT if compute == "tf32" and wire == "float32" else _ARITHMETIC_UNIT[wire]
    arithmetic = 2 * (k + 2) * unit * scale
    allowed = arithmetic + _OUTPUT_UNIT[wire] * (np.abs(want) + arithmetic) + _OUTPUT_TINY[wire]
    g = got.astype(np.float64)
    if not np.all(np.isfinite(g)):
        return "non-finite values in the result"
    error = np.abs(g - want)
    if np.any(error > allowed):
        index = np.unravel_index(np.argmax(error - allowed), error.shape)
        return (f"C{list(index)} = {g[index]!r}, reference {want[index]!r}, "
                f"error {error[index]:.3g} > allowed {allowed[index]:.3g}")
    return None


@dataclass
class ValidCall:
    """Arguments of one valid Client.multiply, and the operands as they travel."""
    a: np.ndarray
    b: np.ndarray
    transpose_a: bool
    transpose_b: bool
    compute: str
    wire: str  # float32, float64, float16 or bfloat16

    def travelled(self, x: np.ndarray) -> np.ndarray:
        if self.wire == "bfloat16":
            return matmul_client.bfloat16_bits_to_float32(matmul_client.float32_to_bfloat16_bits(x))
        return x

    def check(self, got: np.ndarray) -> Optional[str]:
        return check_product(got, self.travelled(self.a), self.travelled(self.b),
                             self.transpose_a, self.transpose_b, self.wire, self.compute)

    def describe(self) -> str:
        return (f"{self.wire} a{list(self.a.shape)} b{list(self.b.shape)} "
                f"ta={self.transpose_a} tb={self.transpose_b} compute={self.compute}")


def random_valid(rng: random.Random, nprng: np.random.Generator) -> ValidCall:
    wire = rng.choice(["float32", "float32", "float64", "float16", "bfloat16"])
    big = rng.random() < 0.1
    m, n, k = (rng.randint(1, 200 if big else 48) for _ in range(3))
    layout = rng.randrange(5)
    batch = rng.randint(2, 4)
    a_batch, b_batch = {0: (None, None), 1: (batch, batch), 2: (batch, None),
                        3: (None, batch), 4: (1, batch)}[layout]
    transpose_a, transpose_b = rng.random() < 0.5, rng.random() < 0.5

    def operand(rows: int, cols: int, batch_size: Optional[int], transpose: bool) -> np.ndarray:
        shape = (cols, rows) if transpose else (rows, cols)
        if batch_size is not None:
            shape = (batch_size, *shape)
        values = nprng.uniform(-1.0, 1.0, size=shape)
        dtype = {"float64": np.float64, "float16": np.float16}.get(wire, np.float32)
        return values.astype(dtype)

    a = operand(m, k, a_batch, transpose_a)
    b = operand(k, n, b_batch, transpose_b)
    compute = "tf32" if wire == "float32" and rng.random() < 0.3 else "strict"
    return ValidCall(a, b, transpose_a, transpose_b, compute, wire)


def _tensor(shape: List[int], dtype: int = F32, data: Optional[bytes] = None) -> matmul_pb2.Tensor:
    if data is None:
        count = int(np.prod(shape)) if shape and min(shape) > 0 else 0
        size = {matmul_pb2.DTYPE_FLOAT64: 8, matmul_pb2.DTYPE_FLOAT16: 2,
                matmul_pb2.DTYPE_BFLOAT16: 2}.get(dtype, 4)
        data = bytes(count * size)
    return matmul_pb2.Tensor(shape=shape, dtype=dtype, data=data)


def _request(a: Optional[matmul_pb2.Tensor], b: Optional[matmul_pb2.Tensor],
             **options: object) -> matmul_pb2.MultiplyRequest:
    request = matmul_pb2.MultiplyRequest(**options)
    if a is not None:
        request.a.CopyFrom(a)
    if b is not None:
        request.b.CopyFrom(b)
    return request


INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

# (name, request, the code the server must answer with). Sizes stay small on
# the wire: limits are checked from the shapes before the data.
INVALID_REQUESTS: List[Tuple[str, matmul_pb2.MultiplyRequest, grpc.StatusCode]] = [
    ("inner dimensions differ", _request(_tensor([3, 4]), _tensor([5, 2])), INVALID_ARGUMENT),
    ("data one byte short", _request(_tensor([3, 4], data=bytes(47)), _tensor([4, 2])), INVALID_ARGUMENT),
    ("data too long", _request(_tensor([3, 4]), _tensor([4, 2], data=bytes(33))), INVALID_ARGUMENT),
    ("dtype unspecified", _request(_tensor([2, 2], 0, bytes(16)), _tensor([2, 2])), INVALID_ARGUMENT),
    ("dtype unknown", _request(_tensor([2, 2], 17, bytes(16)), _tensor([2, 2], 17, bytes(16))),
     INVALID_ARGUMENT),
    ("dtypes differ", _request(_tensor([2, 2]), _tensor([2, 2], matmul_pb2.DTYPE_FLOAT64)),
     INVALID_ARGUMENT),
    ("rank 1", _request(_tensor([4]), _tensor([4, 1])), INVALID_ARGUMENT),
    ("rank 4", _request(_tensor([1, 1, 2, 2]), _tensor([2, 2])), INVALID_ARGUMENT),
    ("zero dimension", _request(_tensor([0, 4]), _tensor([4, 2])), INVALID_ARGUMENT),
    ("negative dimension", _request(_tensor([-3, 4], data=b""), _tensor([4, 2])), INVALID_ARGUMENT),
    ("batches differ", _request(_tensor([2, 2, 2]), _tensor([3, 2, 2])), INVALID_ARGUMENT),
    ("no b", _request(_tensor([2, 2]), None), INVALID_ARGUMENT),
    ("no operands", _request(None, None), INVALID_ARGUMENT),
    ("unknown compute mode", _request(_tensor([2, 2]), _tensor([2, 2]), compute_mode=9),
     INVALID_ARGUMENT),
    ("dimension 2^31", _request(_tensor([1 << 31, 1], data=b""), _tensor([1, 1])), RESOURCE_EXHAUSTED),
    ("dimension 2^62", _request(_tensor([1, 1 << 62], data=b""), _tensor([1 << 62, 1], data=b"")),
     RESOURCE_EXHAUSTED),
    ("2^32 elements", _request(_tensor([1 << 16, 1 << 16], data=b""), _tensor([1 << 16, 1], data=b"")),
     RESOURCE_EXHAUSTED),
    ("batch 2^40", _request(_tensor([1 << 40, 1, 1], data=b""), _tensor([1, 1])), RESOURCE_EXHAUSTED),
    ("result over 2^31 elements", _request(_tensor([50000, 1]), _tensor([1, 50000])),
     RESOURCE_EXHAUSTED),
]


def _f32_request(nprng: np.random.Generator, n: int) -> Tuple[matmul_pb2.MultiplyRequest, np.ndarray, np.ndarray]:
    a = nprng.uniform(-1, 1, size=(n, n)).astype(np.float32)
    b = nprng.uniform(-1, 1, size=(n, n)).astype(np.float32)
    request = _request(_tensor([n, n], F32, a.tobytes()), _tensor([n, n], F32, b.tobytes()))
    return request, a, b


def _decode_f32(response: matmul_pb2.MultiplyResponse) -> np.ndarray:
    c = response.c
    if c.dtype != F32:
        raise AssertionError(f"result dtype {c.dtype}, expected DTYPE_FLOAT32")
    return np.frombuffer(c.data, dtype="<f4").reshape(tuple(c.shape))


# ---------------------------------------------------------------------------
# Workers


@dataclass
class Tally:
    """What one worker saw: counts[kind][code name], answers checked, failures."""
    counts: Dict[str, collections.Counter] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    checked: int = 0
    failures: List[str] = field(default_factory=list)
    pushback: int = 0  # RESOURCE_EXHAUSTED answers to valid calls (server busy)

    def merge(self, other: "Tally") -> None:
        for kind, counter in other.counts.items():
            self.counts[kind].update(counter)
        self.checked += other.checked
        self.failures.extend(other.failures)
        self.pushback += other.pushback

    def by_code(self) -> collections.Counter:
        total: collections.Counter = collections.Counter()
        for counter in self.counts.values():
            total.update(counter)
        return total

    def total(self) -> int:
        return sum(self.by_code().values())


class Connection:
    """One client connection: a matmul_client.Client, and a raw stub for the
    requests the client library would refuse to build. Each has its own
    subchannel pool, so that every Connection is its own TCP connection."""

    def __init__(self, target: str) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)]
        self.client = matmul_client.Client(target, timeout=GENEROUS_TIMEOUT_S, options=options)
        self.channel = grpc.insecure_channel(target, options=options + [
            ("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)])
        self.stub = matmul_pb2_grpc.MatmulServiceStub(self.channel)

    def close(self) -> None:
        self.client.close()
        self.channel.close()


class Worker:
    def __init__(self, seed: int, connection: Connection) -> None:
        self.rng = random.Random(seed)
        self.nprng = np.random.default_rng(seed)
        self.connection = connection
        self.tally = Tally()

    def fail(self, message: str) -> None:
        if len(self.tally.failures) < 50:
            self.tally.failures.append(message)

    def run(self, until: float, stop: threading.Event) -> None:
        kinds = [k for k, _ in MIX]
        weights = [w for _, w in MIX]
        calls = {"valid": self.valid, "invalid": self.invalid,
                 "cancelled": self.cancelled, "deadline": self.deadline}
        try:
            for _ in range(MAX_CALLS_PER_WORKER):
                if time.monotonic() >= until or stop.is_set():
                    return
                kind = self.rng.choices(kinds, weights)[0]
                code = calls[kind]()
                self.tally.counts[kind][code.name] += 1
        except Exception:  # noqa: BLE001 - reported by the test.
            self.fail(f"worker crashed:\n{traceback.format_exc()}")
            stop.set()

    def valid(self) -> grpc.StatusCode:
        call = random_valid(self.rng, self.nprng)
        kwargs = {"dtype": "bfloat16"} if call.wire == "bfloat16" else {}
        try:
            got = self.connection.client.multiply(
                call.a, call.b, transpose_a=call.transpose_a, transpose_b=call.transpose_b,
                compute=call.compute, **kwargs)
        except matmul_client.MatmulError as error:
            if error.code() == RESOURCE_EXHAUSTED:
                self.tally.pushback += 1  # the server is busy: allowed, counted
            else:
                self.fail(f"valid call {call.describe()} failed: {error}")
            return error.code()
        problem = call.check(got)
        if problem:
            self.fail(f"WRONG ANSWER for {call.describe()}: {problem}")
        else:
            self.tally.checked += 1
        return grpc.StatusCode.OK

    def invalid(self) -> grpc.StatusCode:
        name, request, expected = self.rng.choice(INVALID_REQUESTS)
        try:
            self.connection.stub.Multiply(request, timeout=GENEROUS_TIMEOUT_S)
        except grpc.RpcError as error:
            code = error.code()
            if code != expected:
                self.fail(f"invalid request '{name}': got {code.name} ({error.details()}), "
                          f"expected {expected.name}")
            return code
        self.fail(f"invalid request '{name}' was accepted")
        return grpc.StatusCode.OK

    def _check_f32(self, kind: str, response: matmul_pb2.MultiplyResponse, a: np.ndarray,
                   b: np.ndarray) -> None:
        problem = check_product(_decode_f32(response), a, b, False, False, "float32")
        if problem:
            self.fail(f"WRONG ANSWER for a {kind} call that finished (n={a.shape[0]}): {problem}")
        else:
            self.tally.checked += 1

    def cancelled(self) -> grpc.StatusCode:
        request, a, b = _f32_request(self.nprng, self.rng.randint(128, 384))
        future = self.connection.stub.Multiply.future(request, timeout=GENEROUS_TIMEOUT_S)
        time.sleep(self.rng.uniform(0.0, 0.030))
        if future.cancel():
            return grpc.StatusCode.CANCELLED
        code = future.code()  # it finished before the cancel
        if code == grpc.StatusCode.OK:
            self._check_f32("cancelled", future.result(), a, b)
        elif code != RESOURCE_EXHAUSTED:
            self.fail(f"cancelled call finished with {code.name}: {future.details()}")
        return code

    def deadline(self) -> grpc.StatusCode:
        request, a, b = _f32_request(self.nprng, self.rng.randint(256, 512))
        try:
            response = self.connection.stub.Multiply(request, timeout=self.rng.uniform(0.001, 0.010))
        except grpc.RpcError as error:
            code = error.code()
            if code not in (grpc.StatusCode.DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED):
                self.fail(f"deadline call finished with {code.name}: {error.details()}")
            return code
        self._check_f32("deadline", response, a, b)
        return grpc.StatusCode.OK


class SilentStreams:
    """A client that opens MultiplyStreams and never reads them (see the
    module's docstring), on a thread of its own until stopped."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.taken: List[int] = []  # messages the server took, per stream
        self.failures: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SilentStreams":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=GENEROUS_TIMEOUT_S)
        if self._thread.is_alive():
            self.failures.append("the silent client did not stop")

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_stream()
        except Exception:  # noqa: BLE001 - reported by the test.
            self.failures.append(f"silent client crashed:\n{traceback.format_exc()}")

    def _one_stream(self) -> None:
        taken = silent_stream(self.target, self._stop.wait)
        self.taken.append(taken)
        if taken >= SILENT_STREAM_MAX_TAKEN:
            self.failures.append(
                f"a MultiplyStream that was never read took {taken} messages of 4 KiB "
                f"in {SILENT_STREAM_SECONDS} s (at most {SILENT_STREAM_MAX_TAKEN})")


def silent_stream(target: str, wait: Callable[[float], object], bdp_probe: bool = False,
                  while_open: Optional[Callable[[], None]] = None) -> int:
    """Opens a MultiplyStream on a connection of its own, offers it chunks
    for ids never started without reading anything, waits
    SILENT_STREAM_SECONDS (``wait``, which may return early), calls
    ``while_open``, cancels, and returns how many messages the server took.

    Without ``bdp_probe`` the connection keeps HTTP/2's initial receive
    window (see the module's docstring)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    if not bdp_probe:
        options.append(("grpc.http2.bdp_probe", 0))
    with grpc.insecure_channel(target, options=options) as channel:
        stub = matmul_pb2_grpc.MatmulServiceStub(channel)
        offered = [0]

        def requests():
            for i in range(SILENT_STREAM_MESSAGES):
                offered[0] = i + 1
                yield matmul_pb2.MultiplyStreamRequest(
                    request_id=1_000_000 + i,
                    chunk=matmul_pb2.OperandChunk(operand=matmul_pb2.OPERAND_A, offset=0,
                                                  data=b"\1" * 4096))

        call = stub.MultiplyStream(requests(), timeout=GENEROUS_TIMEOUT_S)
        wait(SILENT_STREAM_SECONDS)
        if while_open is not None:
            while_open()
        call.cancel()
        # gRPC pulls one message ahead of what the transport took.
        return max(0, offered[0] - 1)


def run_phase(connections: List[Connection], seconds: float, seed: int,
              on_tick: Optional[Callable[[], None]] = None) -> Tuple[Tally, float]:
    """WORKERS workers for ``seconds``; returns the merged tally and wall time."""
    stop = threading.Event()
    workers = [Worker(seed * 1000 + i, connections[i % len(connections)]) for i in range(WORKERS)]
    started = time.monotonic()
    until = started + seconds
    threads = [threading.Thread(target=w.run, args=(until, stop), daemon=True) for w in workers]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if on_tick:
            on_tick()
        for t in threads:
            t.join(timeout=0.5)
    elapsed = time.monotonic() - started
    tally = Tally()
    for w in workers:
        tally.merge(w.tally)
    return tally, elapsed


# ---------------------------------------------------------------------------
# Metrics


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port: Optional[int]) -> Optional[List[Tuple[str, Dict[str, str], float]]]:
    """The samples of /metrics, or None if the endpoint does not answer."""
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def multiply_counts(samples: List[Tuple[str, Dict[str, str], float]]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for name, labels, value in samples:
        if name == "matmul_requests_total" and labels.get("method") == "Multiply":
            counts[labels["code"]] += int(value)
    return counts


def pool_gauges(samples: List[Tuple[str, Dict[str, str], float]]) -> Dict[str, float]:
    """The gauges that must be back to 0 when the server is idle."""
    gauges: Dict[str, float] = {}
    for name, labels, value in samples:
        if name in ("matmul_inflight_requests", "matmul_inflight_bytes"):
            gauges[name] = value
        elif name == "matmul_queued_requests":
            gauges[f"{name}{{device={labels.get('device')}}}"] = value
        elif name == "matmul_pinned_bytes" and labels.get("state") == "used":
            gauges[f"{name}{{device={labels.get('device')},state=used}}"] = value
    return gauges


def check_request_counts(client: Tally, server: collections.Counter) -> Tuple[List[str], Dict[str, int]]:
    """Compares the server's matmul_requests_total{method="Multiply"} deltas with
    what the client saw. Returns (problems, figures).

    A call's code is unambiguous unless it raced with a cancellation:
      - valid and invalid calls are never cancelled, so the server recorded
        exactly the code the client got;
      - a cancelled or deadline call ("racy") that the client saw finish (OK,
        or RESOURCE_EXHAUSTED when the server is busy) was recorded with that
        code;
      - a racy call that the client saw fail (CANCELLED, DEADLINE_EXCEEDED:
        "racy_failed") may have been recorded by the server as OK (it
        finished before the cancel reached the server), CANCELLED (the
        server saw the cancel or the deadline: its OnCancel answers CANCELLED
        for both), DEADLINE_EXCEEDED (the deadline passed before admission or
        while queued), RESOURCE_EXHAUSTED (refused as busy), or not at all
        (the client gave up before the server had the whole request, so no
        handler ran: "unseen").
    Hence:
      1. INVALID_ARGUMENT and every code other than OK, CANCELLED,
         DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED: server == client;
      2. server OK >= client OK and server RESOURCE_EXHAUSTED >= client's;
      3. late = (server OK - client OK) + (server RESOURCE_EXHAUSTED -
         client's) + server CANCELLED + server DEADLINE_EXCEEDED is the
         number of racy_failed calls the server saw, so
         unseen = racy_failed - late must be in [0, racy_failed], and the
         totals satisfy server == client - unseen.
    """
    client_codes = client.by_code()
    racy = collections.Counter()
    for kind in ("cancelled", "deadline"):
        racy.update(client.counts.get(kind, collections.Counter()))
    racy_failed = racy["CANCELLED"] + racy["DEADLINE_EXCEEDED"]
    ambiguous = ("OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
    problems = []
    for code in sorted(set(client_codes) | set(server)):
        if code not in ambiguous and client_codes[code] != server[code]:
            problems.append(f"{code}: server counted {server[code]}, client saw {client_codes[code]}")
    for code in ("OK", "RESOURCE_EXHAUSTED"):
        if server[code] < client_codes[code]:
            problems.append(f"{code}: server counted {server[code]}, fewer than the "
                            f"{client_codes[code]} the client saw")
    late_ok = server["OK"] - client_codes["OK"]
    late = (late_ok + server["RESOURCE_EXHAUSTED"] - client_codes["RESOURCE_EXHAUSTED"]
            + server["CANCELLED"] + server["DEADLINE_EXCEEDED"])
    unseen = racy_failed - late
    if not 0 <= unseen <= racy_failed:
        problems.append(f"racy calls: the server counted {late} (late OK or RESOURCE_EXHAUSTED, "
                        f"CANCELLED, DEADLINE_EXCEEDED) of the {racy_failed} the client saw "
                        f"cancelled or timed out")
    server_total = sum(server.values())
    if server_total != client.total() - unseen:
        problems.append(f"totals: server {server_total}, client {client.total()}, unseen {unseen}")
    figures = {
        "client_total": client.total(),
        "server_total": server_total,
        "racy_calls_failed_on_client": racy_failed,
        "racy_calls_finished_ok_on_server": late_ok,
        "racy_calls_unseen_by_server": unseen,
    }
    return problems, figures


# ---------------------------------------------------------------------------
# The test


def _wait_idle(server, baseline_rss: int) -> Tuple[Optional[list], int]:
    """Waits until the pool gauges are 0 and the counters stop moving (if
    /metrics answers) and RSS is near the baseline; returns the last scrape
    and RSS."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    previous = None
    time.sleep(0.5)
    while True:
        samples = scrape(server.metrics_port)
        rss = server.rss_bytes()
        idle = samples is None or (all(v == 0 for v in pool_gauges(samples).values())
                                   and previous is not None
                                   and multiply_counts(samples) == multiply_counts(previous))
        if (idle and rss <= baseline_rss + RSS_SLACK_BYTES) or time.monotonic() >= deadline:
            return samples, rss
        previous = samples
        time.sleep(0.5)


def test_soak(soak_server, soak_seconds: float) -> None:
    server = soak_server
    warmup_seconds = min(10.0, max(3.0, soak_seconds / 6))
    connections = [Connection(server.target) for _ in range(CONNECTIONS)]
    try:
        # Warm-up: thread pools, allocator arenas and connection buffers
        # reach their working size; the baseline is taken after it.
        warmup, _ = run_phase(connections, warmup_seconds, seed=1)
        assert not warmup.failures, "\n".join(warmup.failures)
        _wait_idle(server, server.rss_bytes())
        time.sleep(1.0)
        baseline_rss = server.rss_bytes()
        samples_before = scrape(server.metrics_port)

        peak_rss = [baseline_rss]
        last_sample = [0.0]

        def sample_rss() -> None:
            now = time.monotonic()
            if now - last_sample[0] >= 1.0:
                last_sample[0] = now
                peak_rss[0] = max(peak_rss[0], server.rss_bytes())

        with SilentStreams(server.target) as silent:
            tally, elapsed = run_phase(connections, soak_seconds, seed=2, on_tick=sample_rss)
        assert server.alive(), f"matmul-server died during the soak:\n{server.output()}"
        samples_after, rss_after = _wait_idle(server, baseline_rss)

        # Still serving, and still right.
        health = {name: connections[0].client.health(name)
                  for name in ("", "matmul.v1.MatmulService")}
        rng = np.random.default_rng(3)
        a = rng.uniform(-1, 1, (64, 48)).astype(np.float32)
        b = rng.uniform(-1, 1, (48, 80)).astype(np.float32)
        final_problem = check_product(connections[0].client.multiply(a, b), a, b, False, False, "float32")
    finally:
        for c in connections:
            c.close()

    report: Dict[str, object] = {
        "engine": server.engine,
        "duration_s": round(elapsed, 1),
        "warmup_s": round(warmup_seconds, 1),
        "connections": CONNECTIONS,
        "workers": WORKERS,
        "requests": tally.total(),
        "requests_per_second": round(tally.total() / elapsed, 1),
        "by_code": dict(sorted(tally.by_code().items())),
        "by_kind": {kind: dict(sorted(c.items())) for kind, c in sorted(tally.counts.items())},
        "answers_checked": tally.checked,
        "wrong_answers": sum("WRONG ANSWER" in f for f in tally.failures),
        "valid_refused_busy": tally.pushback,
        "rss_baseline_mib": round(baseline_rss / 2**20, 1),
        "rss_peak_soak_mib": round(peak_rss[0] / 2**20, 1),
        "rss_peak_lifetime_mib": round(server.peak_rss_bytes() / 2**20, 1),
        "rss_after_mib": round(rss_after / 2**20, 1),
        "rss_limit_mib": round((baseline_rss + RSS_SLACK_BYTES) / 2**20, 1),
        "health": health,
        "silent_streams": len(silent.taken),
        "silent_stream_messages_taken_max": max(silent.taken, default=0),
    }
    problems: List[str] = list(tally.failures) + silent.failures
    if not silent.taken:
        problems.append("the silent client opened no stream")
    if final_problem:
        problems.append(f"final multiply: {final_problem}")
    if any(status != "SERVING" for status in health.values()):
        problems.append(f"health after the soak: {health}")
    if rss_after > baseline_rss + RSS_SLACK_BYTES:
        problems.append(f"RSS {rss_after >> 20} MiB after the soak, baseline {baseline_rss >> 20} MiB "
                        f"(limit +{RSS_SLACK_BYTES >> 20} MiB)")
    if tally.counts["valid"].get("OK", 0) == 0:
        problems.append("no valid call succeeded")

    if samples_before is not None and samples_after is not None:
        gauges = pool_gauges(samples_after)
        busy = {name: value for name, value in gauges.items() if value != 0}
        if busy:
            problems.append(f"pool not idle after the soak: {busy}")
        before, after = multiply_counts(samples_before), multiply_counts(samples_after)
        delta = collections.Counter({code: after[code] - before[code] for code in after})
        delta = +delta  # drop zeros
        count_problems, figures = check_request_counts(tally, delta)
        problems.extend(count_problems)
        report["metrics"] = {"server_by_code": dict(sorted(delta.items())), "pool_gauges": gauges,
                             **figures}
    else:
        report["metrics"] = None  # no /metrics endpoint: those checks were skipped
    # Leak indicators that fired: each pool gauge not back to 0, and RSS
    # over its limit.
    leaks = int(rss_after > baseline_rss + RSS_SLACK_BYTES)
    if report["metrics"]:
        leaks += sum(value != 0 for value in report["metrics"]["pool_gauges"].values())
    report["leaks"] = leaks
    report["problems"] = problems[:50]

    print("\nsoak summary:\n" + json.dumps(report, indent=2))
    if os.environ.get("MATMUL_SOAK_REPORT"):
        with open(os.environ["MATMUL_SOAK_REPORT"], "w") as out:
            json.dump(report, out, indent=2)
            out.write("\n")
    sanitizer = re.search(r"(AddressSanitizer|ThreadSanitizer|LeakSanitizer|runtime error:).*",
                          server.output())
    if sanitizer:
        problems.append(f"sanitizer report in the server's log: {sanitizer.group(0)}")
    assert not problems, "soak failed:\n" + "\n".join(problems)


# CPU-bound processes beside the server in the test below, and how long each
# may run at most (they are stopped when the test ends).
CPU_HOGS = 2
CPU_HOG_SECONDS = 120
SILENT_STREAM_RUNS = 4


def test_silent_streams_beside_busy_cores(soak_server) -> None:
    """The silent-stream bound on a machine whose cores are taken: with two
    CPU-bound processes beside the server, a stream that is never read is
    held back by flow control every time, and the server's memory does not
    grow with it; nor with a client whose transport takes every answer
    (BDP probing on), which the server can only answer as fast as it runs."""
    server = soak_server
    hog = f"import time\nend = time.monotonic() + {CPU_HOG_SECONDS}\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(CPU_HOGS)]
    results: List[Dict[str, object]] = []
    try:
        for run in range(SILENT_STREAM_RUNS):
            for bdp_probe in (False, True):
                before = server.rss_bytes()
                during = [0]

                def sample() -> None:
                    during[0] = server.rss_bytes()

                taken = silent_stream(server.target, time.sleep, bdp_probe=bdp_probe,
                                      while_open=sample)
                results.append({"run": run, "bdp_probe": bdp_probe, "taken": taken,
                                "rss_growth_mib": round((during[0] - before) / 2**20, 1)})
                assert server.alive(), f"matmul-server died:\n{server.output()}"
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    print("\nsilent streams beside busy cores:\n" + json.dumps(results, indent=1))
    problems = []
    for r in results:
        if not r["bdp_probe"] and r["taken"] >= SILENT_STREAM_MAX_TAKEN:
            problems.append(f"run {r['run']}: a MultiplyStream that was never read took "
                            f"{r['taken']} messages of 4 KiB (at most {SILENT_STREAM_MAX_TAKEN})")
        if r["rss_growth_mib"] * 2**20 > SILENT_STREAM_RSS_SLACK_BYTES:
            problems.append(f"run {r['run']} (BDP probing {'on' if r['bdp_probe'] else 'off'}): "
                            f"the server's RSS grew {r['rss_growth_mib']} MiB while the stream "
                            f"was open (at most {SILENT_STREAM_RSS_SLACK_BYTES >> 20} MiB)")
    assert not problems, "\n".join(problems)
