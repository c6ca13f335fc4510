"""gRPC channels to a matmul server: TLS settings and default options."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import grpc

from ._proto.grpc.health.v1 import health_pb2, health_pb2_grpc

ChannelOption = Tuple[str, Any]

#: Options every channel gets unless the caller passes the same key:
#: unlimited message sizes (the server enforces its own limit and says so
#: with RESOURCE_EXHAUSTED), and round-robin over every address a target
#: resolves to (e.g. all pods behind a headless Kubernetes service with
#: "dns:///matmul.ns.svc.cluster.local:50051"); a call that ends UNAVAILABLE
#: or CANCELLED before the server answered anything (a draining server's
#: refusal, or a call that reached it as its transport closed) is retried up
#: to three times, on the next server under round_robin.
DEFAULT_OPTIONS: Tuple[ChannelOption, ...] = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.service_config", json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{
            "name": [{"service": "matmul.v1.MatmulService"}],
            "retryPolicy": {
                "maxAttempts": 4,
                "initialBackoff": "0.02s",
                "maxBackoff": "0.2s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
            },
        }],
    })),
)


@dataclass(frozen=True)
class TlsConfig:
    """TLS, or mutual TLS, settings for a channel. All certificates are PEM.

    Attributes:
        root_certificates: CAs that may sign the server's certificate; None
            uses gRPC's default roots.
        certificate_chain: The client's certificate, for mutual TLS.
        private_key: The client certificate's private key, for mutual TLS.
        server_name: The name the server's certificate must carry, when it
            is not the target's host name (sets grpc.ssl_target_name_override).
    """

    root_certificates: Optional[bytes] = None
    certificate_chain: Optional[bytes] = None
    private_key: Optional[bytes] = None
    server_name: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ValueError("TlsConfig: certificate_chain and private_key go together")

    @classmethod
    def from_files(
        cls,
        root_certificates: Union[str, Path, None] = None,
        certificate_chain: Union[str, Path, None] = None,
        private_key: Union[str, Path, None] = None,
        server_name: Optional[str] = None,
    ) -> "TlsConfig":
        """Reads the PEM files at the given paths (None: not set)."""

        def read(path: Union[str, Path, None]) -> Optional[bytes]:
            return None if path is None else Path(path).read_bytes()

        return cls(read(root_certificates), read(certificate_chain), read(private_key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials these settings describe."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )


TlsArgument = Union[TlsConfig, Mapping[str, Any], bool, None]


def tls_config(tls: TlsArgument) -> Optional[TlsConfig]:
    """Normalises Client's ``tls`` argument: None/False is plaintext, True is TLS
    with default roots, a mapping holds TlsConfig's fields."""
    if tls is None or tls is False:
        return None
    if tls is True:
        return TlsConfig()
    if isinstance(tls, TlsConfig):
        return tls
    if isinstance(tls, Mapping):
        return TlsConfig(**tls)
    raise TypeError(f"tls: expected None, a bool, a TlsConfig or a mapping, got {type(tls).__name__}")


def channel_options(
    options: Sequence[ChannelOption], tls: Optional[TlsConfig]
) -> List[ChannelOption]:
    """DEFAULT_OPTIONS (and the TLS name override), overridden key by key by ``options``."""
    merged = dict(DEFAULT_OPTIONS)
    if tls is not None and tls.server_name is not None:
        merged["grpc.ssl_target_name_override"] = tls.server_name
    merged.update(options)
    return list(merged.items())


def make_channel(target: str, tls: TlsArgument, options: Sequence[ChannelOption]) -> grpc.Channel:
    """A channel to ``target`` ("host:port", "dns:///name:port", "unix:path", ...)."""
    config = tls_config(tls)
    merged = channel_options(options, config)
    if config is None:
        return grpc.insecure_channel(target, options=merged)
    return grpc.secure_channel(target, config.credentials(), options=merged)


def remaining_seconds(end: Optional[float]) -> Optional[float]:
    """Seconds left until ``end`` (a time.monotonic() value), at least 0;
    None for no end."""
    return None if end is None else max(0.0, end - time.monotonic())


def first_unconnected(channels: Sequence[grpc.Channel], end: Optional[float]) -> Optional[int]:
    """Waits, until ``end`` (time.monotonic(); None: no bound), for each of
    ``channels`` to connect, riding out a failed connect by gRPC's reconnect
    backoff; the index of the first that did not in time, or None. A channel
    counts as connected once a health check that waits for its connection
    gets the server's answer, whatever it says (grpc.channel_ready_future
    leaves a polling thread that fails if the channel closes soon after)."""
    for i, channel in enumerate(channels):
        try:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(),
                timeout=remaining_seconds(end),
                wait_for_ready=True,
            )
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                return i
    return None
