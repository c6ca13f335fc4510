"""matmul_client: NumPy matrix products computed by a remote matmul server.

    >>> import numpy as np
    >>> from matmul_client import Client
    >>> with Client("localhost:50051") as client:
    ...     c = client.multiply(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))

See :class:`Client` for the API and README.md for set-up.
"""

from ._channel import DEFAULT_OPTIONS, TlsConfig
from ._client import Client
from ._errors import MatmulError
from ._info import Device, Limits, ServerInfo
from ._tensors import BFLOAT16_DTYPE, bfloat16_bits_to_float32, float32_to_bfloat16_bits

__all__ = [
    "BFLOAT16_DTYPE",
    "Client",
    "DEFAULT_OPTIONS",
    "Device",
    "Limits",
    "MatmulError",
    "ServerInfo",
    "TlsConfig",
    "bfloat16_bits_to_float32",
    "float32_to_bfloat16_bits",
]
