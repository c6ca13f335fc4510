"""matmul_client's shape as a package, with no server: what it exports, and
where each public name comes from."""

from __future__ import annotations

import matmul_client

#: The public API: every name matmul_client exports, and the module that
#: defines it. Moving code between the private modules must leave the names
#: unchanged.
PUBLIC_API = {
    "BFLOAT16_DTYPE": "_tensors",
    "CLIENT_ID_METADATA_KEY": "_client",
    "Client": "_client",
    "DEFAULT_OPTIONS": "_channel",
    "Device": "_info",
    "Handle": "_handles",
    "Limits": "_info",
    "MatmulError": "_errors",
    "ServerInfo": "_info",
    "TlsConfig": "_channel",
    "bfloat16_bits_to_float32": "_tensors",
    "float32_to_bfloat16_bits": "_tensors",
}


def test_public_api_is_unchanged() -> None:
    assert sorted(matmul_client.__all__) == sorted(PUBLIC_API)
    for name in matmul_client.__all__:
        assert hasattr(matmul_client, name), name


def test_public_classes_and_functions_name_their_module() -> None:
    for name, module in PUBLIC_API.items():
        value = getattr(matmul_client, name)
        if hasattr(value, "__module__") and callable(value):
            assert value.__module__ == f"matmul_client.{module}", name
