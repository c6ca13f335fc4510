"""matmul_client: NumPy matrix products computed by a remote matmul server.

    >>> import numpy as np
    >>> from matmul_client import Client
    >>> with Client("localhost:50051") as client:
    ...     c = client.multiply(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))

Tensors can stay on the server between multiplies:

    >>> with Client("localhost:50051", client_id="notebook-1") as client:
    ...     with client.upload(a) as ha:                   # a Handle
    ...         hab = client.multiply(ha, b, keep=True)    # A.B stays there
    ...         abc = client.multiply(hab, c)              # (A.B).C comes back
    ...         hab.delete()

See :class:`Client` for the API and README.md for set-up.
"""

from ._channel import DEFAULT_OPTIONS, TlsConfig
from ._client import CLIENT_ID_METADATA_KEY, Client
from ._errors import MatmulError
from ._handles import Handle
from ._info import Device, Limits, ServerInfo
from ._tensors import BFLOAT16_DTYPE, bfloat16_bits_to_float32, float32_to_bfloat16_bits

__all__ = [
    "BFLOAT16_DTYPE",
    "CLIENT_ID_METADATA_KEY",
    "Client",
    "DEFAULT_OPTIONS",
    "Device",
    "Handle",
    "Limits",
    "MatmulError",
    "ServerInfo",
    "TlsConfig",
    "bfloat16_bits_to_float32",
    "float32_to_bfloat16_bits",
]
