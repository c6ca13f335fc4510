"""matmul_client's conversions and settings that need no server: bfloat16
rounding, operand encoding, channel options and TLS settings."""

from __future__ import annotations

import json
import math

import grpc
import numpy as np
import pytest

from matmul_client import DEFAULT_OPTIONS, TlsConfig, bfloat16_bits_to_float32, float32_to_bfloat16_bits
from matmul_client._channel import channel_options, tls_config
from matmul_client._proto.matmul.v1 import matmul_pb2
from matmul_client._tensors import resolve_wire_type, to_tensor


def reference_bfloat16_bits(x: np.float32) -> int:
    """The bfloat16 nearest to a finite float32 (ties to even), chosen between
    its two bfloat16 neighbours by distance in float64. An infinity counts as
    +-2**128 there, as in IEEE rounding."""
    toward_zero = int(np.float32(x).view(np.uint32)) >> 16
    below, above = toward_zero, toward_zero + 1  # above: the larger magnitude.

    def value(bits: int) -> float:
        if bits & 0x7FFF == 0x7F80:
            return math.copysign(2.0**128, float(x))
        return float(np.uint32(bits << 16).view(np.float32))

    distance_below = abs(float(x) - value(below))
    distance_above = abs(value(above) - float(x))
    if distance_below != distance_above:
        return below if distance_below < distance_above else above
    return below if below % 2 == 0 else above


@pytest.mark.parametrize(
    "value,bits",
    [
        (1.0, 0x3F80),
        (1 + 2**-8, 0x3F80),  # Tie: to the even neighbour, 1.0.
        (1 + 3 * 2**-8, 0x3F82),  # Tie: to the even neighbour, 1 + 2**-6.
        (1 + 2**-8 + 2**-20, 0x3F81),  # Just above the tie: up.
        (-2.5, 0xC020),
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (1e-45, 0x0000),  # The smallest float32 subnormal rounds to zero.
        (3.3895313892515355e38, 0x7F7F),  # The largest bfloat16.
        (3.4028234663852886e38, 0x7F80),  # The largest float32 rounds to inf.
        (-3.4028234663852886e38, 0xFF80),
        (float("inf"), 0x7F80),
        (float("-inf"), 0xFF80),
    ],
)
def test_bfloat16_rounding_known_values(value: float, bits: int) -> None:
    assert int(float32_to_bfloat16_bits(np.float32(value))) == bits


def test_bfloat16_rounding_matches_reference_on_random_values_and_ties() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**32, size=3000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ties = ((rng.integers(0, 2**16, size=1000, dtype=np.uint32) << 16) | 0x8000).view(np.float32)
    values = np.concatenate([values, ties])
    values = values[np.isfinite(values)]
    got = float32_to_bfloat16_bits(values)
    expected = [reference_bfloat16_bits(v) for v in values]
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.uint16))


def test_bfloat16_nan_stays_nan_with_its_sign() -> None:
    nans = np.array([np.nan, -np.nan, np.uint32(0x7F800001).view(np.float32)], dtype=np.float32)
    widened = bfloat16_bits_to_float32(float32_to_bfloat16_bits(nans))
    assert np.all(np.isnan(widened))
    np.testing.assert_array_equal(np.signbit(widened), np.signbit(nans))


def test_bfloat16_values_round_trip_exactly() -> None:
    bits = np.arange(0, 0x10000, dtype=np.uint32).astype(np.uint16)
    values = bfloat16_bits_to_float32(bits)
    finite = np.isfinite(values)
    np.testing.assert_array_equal(float32_to_bfloat16_bits(values[finite]), bits[finite])


def test_bfloat16_conversion_keeps_shape() -> None:
    x = np.ones((2, 3, 4), np.float64)
    assert float32_to_bfloat16_bits(x).shape == (2, 3, 4)
    assert float32_to_bfloat16_bits(x).dtype == np.uint16


def test_column_major_operand_is_sent_transposed_without_copy() -> None:
    a = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    wire = resolve_wire_type(a, a, None)
    tensor, transpose = to_tensor(a, wire, False)
    assert transpose is True and list(tensor.shape) == [3, 2]
    assert tensor.data == np.ascontiguousarray(a.T).tobytes()


def test_operands_travel_little_endian_row_major() -> None:
    a = np.arange(6, dtype=">f8").reshape(2, 3)[:, ::-1]
    tensor, transpose = to_tensor(a, resolve_wire_type(a, a, None), False)
    assert transpose is False and tensor.dtype == matmul_pb2.DTYPE_FLOAT64
    assert tensor.data == np.ascontiguousarray(a, dtype="<f8").tobytes()


def test_default_channel_options() -> None:
    options = dict(channel_options([], None))
    assert options["grpc.max_send_message_length"] == -1
    assert options["grpc.max_receive_message_length"] == -1
    config = json.loads(options["grpc.service_config"])
    assert config["loadBalancingConfig"] == [{"round_robin": {}}]
    (method,) = config["methodConfig"]
    assert method["name"] == [{"service": "matmul.v1.MatmulService"}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"]
    assert dict(DEFAULT_OPTIONS) == options


def test_caller_options_override_defaults() -> None:
    caller = [("grpc.max_receive_message_length", 10), ("grpc.primary_user_agent", "x")]
    options = channel_options(caller, None)
    assert dict(options)["grpc.max_receive_message_length"] == 10
    assert dict(options)["grpc.primary_user_agent"] == "x"
    assert len(options) == len(DEFAULT_OPTIONS) + 1


def test_tls_server_name_sets_target_name_override() -> None:
    options = dict(channel_options([], TlsConfig(server_name="matmul.test")))
    assert options["grpc.ssl_target_name_override"] == "matmul.test"


def test_tls_argument_forms() -> None:
    assert tls_config(None) is None and tls_config(False) is None
    assert tls_config(True) == TlsConfig()
    assert tls_config({"root_certificates": b"pem"}) == TlsConfig(root_certificates=b"pem")
    with pytest.raises(TypeError):
        tls_config("yes")


def test_tls_certificate_and_key_go_together() -> None:
    with pytest.raises(ValueError, match="certificate_chain and private_key"):
        TlsConfig(certificate_chain=b"cert")


def test_tls_from_files_and_credentials(tmp_path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(name.encode())
    config = TlsConfig.from_files(tmp_path / "ca.pem", tmp_path / "client.pem", str(tmp_path / "client.key"))
    assert config == TlsConfig(b"ca.pem", b"client.pem", b"client.key")
    assert isinstance(config.credentials(), grpc.ChannelCredentials)


# --- stored-tensor requests (no server) ----------------------------------------------


def _handle(dtype: str = "float32", shape=(3, 4)):
    from matmul_client import Handle

    return Handle(id="h-test", shape=shape, dtype=dtype, device=-1, bytes=48, expires=0.0)


def test_multiply_request_with_handles() -> None:
    from matmul_client._requests import _multiply_request

    b = np.ones((4, 2), np.float32)
    request, wire = _multiply_request(_handle(), b, False, True, "tf32", None, keep=True, result_ttl=2.5)
    assert request.a_handle == "h-test" and not request.HasField("a")
    assert request.HasField("b") and not request.b_handle
    assert request.keep_result and request.result_ttl_seconds == 3  # rounded up
    assert request.transpose_b and not request.transpose_a
    assert request.compute_mode == matmul_pb2.COMPUTE_MODE_TF32
    assert wire.name == "float32"
    request, wire = _multiply_request(_handle("bfloat16"), _handle("bfloat16"), False, False, "strict", None)
    assert request.a_handle == request.b_handle == "h-test"
    assert not request.keep_result and request.result_ttl_seconds == 0
    assert wire.name == "bfloat16"
    assert wire.from_wire(np.array([0x3F80], "<u2").tobytes()).dtype == np.float32


def test_ttl_and_handle_id_arguments() -> None:
    from matmul_client._handles import handle_id, ttl_seconds

    assert ttl_seconds(None, "ttl") == 0
    assert ttl_seconds(1, "ttl") == 1 and ttl_seconds(0.001, "ttl") == 1 and ttl_seconds(np.int64(7), "ttl") == 7
    for bad in (0, -3, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            ttl_seconds(bad, "ttl")
    for bad in (True, "5", [5]):
        with pytest.raises(TypeError):
            ttl_seconds(bad, "ttl")
    assert handle_id(_handle()) == "h-test" and handle_id("h-x") == "h-x"
    with pytest.raises(ValueError):
        handle_id("")
    with pytest.raises(TypeError):
        handle_id(5)


def test_handle_from_proto() -> None:
    from matmul_client import Handle

    message = matmul_pb2.TensorHandle(
        id="h-1", shape=[2, 3, 4], dtype=matmul_pb2.DTYPE_FLOAT16, device=2, bytes=48,
        expire_time_unix_ms=1700000000250,
    )
    h = Handle.from_proto(message)
    assert h == Handle("h-1", (2, 3, 4), "float16", 2, 48, 1700000000.25)
    assert h.ndim == 3
    with pytest.raises(ValueError, match="not bound"):
        h.delete()
