#!/usr/bin/env python3
"""Writes the seed corpus of request_fuzzer (tests/fuzz/corpus/).

Two kinds of seeds, both read by the fuzzer in both ways (see
request_fuzzer.cc):

  wire_*.pb     serialized matmul.v1.MultiplyRequest messages, encoded here by
                hand (protobuf wire format) so that no build is needed; with
                --check they are also parsed with the generated Python stubs
                (PYTHONPATH=build/python) to prove the encoding right.
  struct_*.bin  inputs in the fuzzer's structured decoding (DecodeStructured).

valid_ / invalid_ in a name says what ValidateMultiplyRequest must answer
with the default limits. Run from anywhere:

  /usr/bin/python3 tests/fuzz/make_corpus.py [--check]
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

CORPUS = Path(__file__).resolve().parent / "corpus"

F32, F64, F16, BF16 = 1, 2, 3, 4
ELEMENT_SIZE = {F32: 4, F64: 8, F16: 2, BF16: 2}
STRICT, TF32 = 1, 2


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 travel as 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    return varint(number << 3 | wire_type) + payload


def length_delimited(number: int, payload: bytes) -> bytes:
    return field(number, 2, varint(len(payload)) + payload)


def elements(dtype: int, count: int) -> bytes:
    """`count` small exact values (-2 .. 2 in steps of 0.5) as `dtype` bytes."""
    values = [((i * 7) % 9 - 4) / 2 for i in range(count)]
    if dtype == F32:
        return struct.pack(f"<{count}f", *values)
    if dtype == F64:
        return struct.pack(f"<{count}d", *values)
    if dtype == F16:
        return struct.pack(f"<{count}e", *values)
    # bfloat16: the upper half of the float32 (exact for these values).
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def tensor(shape: Sequence[int], dtype: int, data: Optional[bytes] = None) -> bytes:
    if data is None:
        count = 1
        for d in shape:
            count *= d
        data = elements(dtype, count) if dtype in ELEMENT_SIZE else b""
    out = b""
    if shape:
        out += length_delimited(1, b"".join(varint(d) for d in shape))  # packed
    if dtype:
        out += field(2, 0, varint(dtype))
    if data:
        out += length_delimited(3, data)
    return out


def request(a: Optional[bytes], b: Optional[bytes], transpose_a: bool = False,
            transpose_b: bool = False, compute: int = 0) -> bytes:
    out = b""
    if a is not None:
        out += length_delimited(1, a)
    if b is not None:
        out += length_delimited(2, b)
    if transpose_a:
        out += field(3, 0, varint(1))
    if transpose_b:
        out += field(4, 0, varint(1))
    if compute:
        out += field(5, 0, varint(compute))
    return out


def wire_seeds() -> Dict[str, bytes]:
    seeds = {
        "wire_valid_f32_3x4_by_4x5.pb":
            request(tensor([3, 4], F32), tensor([4, 5], F32)),
        "wire_valid_f64_batched_2x3x4_by_2x4x2.pb":
            request(tensor([2, 3, 4], F64), tensor([2, 4, 2], F64)),
        "wire_valid_f16_transposed_both.pb":
            request(tensor([4, 3], F16), tensor([5, 4], F16), True, True),
        "wire_valid_bf16_broadcast_3x2x3_by_3x2.pb":
            request(tensor([3, 2, 3], BF16), tensor([3, 2], BF16)),
        "wire_valid_f32_batch1_broadcast_tf32.pb":
            request(tensor([1, 2, 2], F32), tensor([4, 2, 3], F32), compute=TF32),
        "wire_invalid_inner_mismatch.pb":
            request(tensor([3, 4], F32), tensor([5, 2], F32)),
        "wire_invalid_data_too_short.pb":
            request(tensor([3, 4], F32, elements(F32, 11)), tensor([4, 5], F32)),
        "wire_invalid_dtype_unspecified.pb":
            request(tensor([2, 2], 0, b"\0" * 16), tensor([2, 2], F32)),
        "wire_invalid_dtype_mismatch.pb":
            request(tensor([2, 2], F32), tensor([2, 2], F64)),
        "wire_invalid_dtype_unknown_9.pb":
            request(tensor([2, 2], 9, b"\0" * 16), tensor([2, 2], 9, b"\0" * 16)),
        "wire_invalid_rank1.pb":
            request(tensor([4], F32), tensor([4, 1], F32)),
        "wire_invalid_zero_dim.pb":
            request(tensor([0, 4], F32, b""), tensor([4, 2], F32)),
        "wire_invalid_negative_dim.pb":
            request(tensor([-3, 4], F32, b""), tensor([4, 2], F32)),
        "wire_invalid_dim_2p31.pb":
            request(tensor([1 << 31, 1], F32, b""), tensor([1, 1], F32)),
        "wire_invalid_elements_overflow_2p62.pb":
            request(tensor([1 << 20, 1 << 21, 1 << 22], F64, b""),
                    tensor([1 << 20, 1 << 22, 2], F64, b"")),
        "wire_invalid_batch_mismatch.pb":
            request(tensor([2, 2, 2], F32), tensor([3, 2, 2], F32)),
        "wire_invalid_missing_b.pb":
            request(tensor([2, 2], F32), None),
        "wire_invalid_empty.pb": b"",
        "wire_invalid_compute_mode_7.pb":
            request(tensor([2, 2], F32), tensor([2, 2], F32), compute=7),
    }
    # Fields 6-9 (a_handle, b_handle, keep_result, result_ttl_seconds).
    seeds["wire_handle_a_keep_result.pb"] = request(
        None, tensor([4, 5], F32)) + length_delimited(6, b"h-0001") + field(8, 0, varint(1)) + \
        field(9, 0, varint(60))
    # A b_handle that is not UTF-8: protobuf refuses it, the zero-copy decoder
    # (which does not know fields 6-9 yet) accepts it: the known divergence.
    seeds["wire_invalid_b_handle_not_utf8.pb"] = request(
        tensor([3, 4], F32), tensor([4, 5], F32)) + length_delimited(7, b"\xff\xfe")
    valid = seeds["wire_valid_f32_3x4_by_4x5.pb"]
    seeds["wire_garbage_truncated.pb"] = valid[: len(valid) // 2]
    return seeds


def structured(flags: int, a_dtype: int, b_dtype: int, mode: int,
               dims: Iterable[int], lengths: Sequence[int] = (0, 0),
               limits: Optional[Sequence[int]] = None, payload: bytes = b"") -> bytes:
    """An input in request_fuzzer.cc's structured decoding."""
    out = bytes([flags, a_dtype & 0xFF, b_dtype & 0xFF, mode & 0xFF])
    for d in dims:
        assert 0 <= d < 0x80 or d >= 0x80 and d <= 0xFF, d
        out += bytes([d])  # 0..127 small dims; 0x80.. adversarial selectors
    out += struct.pack("<HH", *lengths)
    if limits is not None:
        assert flags & 0x80
        out += struct.pack("<Qqqqq", *limits)
    return out + payload


def struct_seeds() -> Dict[str, bytes]:
    exact = 0x30  # both operands get their exact expected data length
    return {
        "struct_valid_f32_3x4_by_4x5.bin":
            structured(exact, F32, F32, STRICT << 1, [3, 4, 4, 5],
                       payload=elements(F32, 8)),
        "struct_valid_f16_batched_transposed.bin":
            structured(exact | 0x04 | 0x08 | 0x03, F16, F16, 0, [2, 5, 3, 2, 4, 5],
                       payload=elements(F16, 8)),
        "struct_valid_bf16_broadcast.bin":
            structured(exact | 0x04, BF16, BF16, 0, [4, 2, 3, 3, 6],
                       payload=elements(BF16, 8)),
        "struct_valid_f64_tf32_mode.bin":
            structured(exact, F64, F64, TF32 << 1, [6, 7, 7, 1],
                       payload=elements(F64, 4)),
        "struct_invalid_explicit_lengths.bin":
            structured(0, F32, F32, 0, [2, 2, 2, 2], lengths=(16, 15)),
        "struct_invalid_dims_2p31_and_2p62.bin":
            structured(exact, F32, F32, 0, [0x80, 1, 1, 0x82]),
        "struct_invalid_drop_b.bin":
            structured(exact | 0x40, F32, F32, 1, [2, 2, 2, 2]),
        "struct_limits_fuzzed.bin":
            structured(exact | 0x80, F32, F32, 0, [8, 8, 8, 8],
                       limits=[1 << 12, 64, 8, 1, 1 << 13], payload=elements(F32, 4)),
    }


def check(seeds: Dict[str, bytes]) -> None:
    """Parses every wire seed with the generated stubs (build/python)."""
    from matmul_client._proto.matmul.v1 import matmul_pb2  # noqa: PLC0415
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    for name, data in seeds.items():
        message = matmul_pb2.MultiplyRequest()
        try:
            message.ParseFromString(data)
        except DecodeError:
            assert "garbage" in name or "not_utf8" in name, name
            continue
        if "garbage" in name or "not_utf8" in name:
            continue
        assert message.SerializeToString() == data, name
        print(f"{name}: a.shape={list(message.a.shape)} b.shape={list(message.b.shape)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="parse the wire seeds with matmul_client's stubs")
    args = parser.parse_args()
    CORPUS.mkdir(exist_ok=True)
    wire = wire_seeds()
    seeds = {**wire, **struct_seeds()}
    for name, data in sorted(seeds.items()):
        (CORPUS / name).write_bytes(data)
    stale = {p.name for p in CORPUS.iterdir()} - set(seeds)
    for name in stale:
        print(f"warning: {CORPUS / name} is not generated by this script", file=sys.stderr)
    print(f"wrote {len(seeds)} seeds to {CORPUS}")
    if args.check:
        check(wire)
    return 0


if __name__ == "__main__":
    sys.exit(main())
