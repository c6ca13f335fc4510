"""Handles that name their server (the server's common/handle_id.h).

A server that advertises an address issues handle ids of the form
``h1.<host:port>.<device>.<32 hex digits>``; a client that spreads its calls
(round_robin over an IP target, the default) sends every call naming such a
handle to that server, on a channel of its own opened on first use and
kept, and every other call over the spread. Ids in any other form ("h-...",
from an older server or one with nothing to advertise) go over the spread.
When the handle's server cannot be reached the call fails NOT_FOUND, saying
so. The C++ library (and so the native core) does the same.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from ._errors import MatmulError

_ID = re.compile(
    r"h1\.(?P<address>.+)\.(?P<device>-1|0|[1-9][0-9]{0,5})\.[0-9a-f]{32}"
)
_PORT = r"(?:[1-9][0-9]{0,4})"
_ADDRESS = re.compile(
    r"(?:(?![.-])[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]{2,}\]):(?P<port>" + _PORT + r")"
)
# Servers whose handle channels a client keeps.
MAX_HOMES = 256


def handle_home(handle_id: str) -> Optional[str]:
    """The address (host:port) of the server a handle id names; None for an
    id that names none."""
    m = _ID.fullmatch(handle_id)
    if m is None:
        return None
    address = m.group("address")
    a = _ADDRESS.fullmatch(address)
    if a is None or int(a.group("port")) > 65535 or len(address) > 255:
        return None
    return address


def handle_device(handle_id: str) -> Optional[int]:
    """The device a handle id names (None: it names none, or the host
    engine's -1)."""
    if handle_home(handle_id) is None:
        return None
    device = int(_ID.fullmatch(handle_id).group("device"))  # type: ignore[union-attr]
    return device if device >= 0 else None


def ip_target_authority(target: str) -> str:
    """The host:port of a target whose servers have IP addresses (dns:,
    ipv4:, ipv6: and scheme-less host:port), as the C++ library reads it;
    "" for other targets (unix:, ...)."""
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            rest = target[len(scheme):]
            if rest.startswith("//"):
                slash = rest.find("/", 2)
                rest = "" if slash < 0 else rest[slash:]
            return rest[1:] if rest.startswith("/") else rest
    if target.startswith(("unix:", "unix-abstract:", "vsock:")) or "/" in target:
        return ""
    return target


def target_addresses(target: str) -> List[str]:
    """The servers (host:port, an IPv6 host in brackets) that an IP target
    names, as round_robin spreads over them: the list of an ipv4: or ipv6:
    target, or what a dns: (or scheme-less) target's name resolves to now.
    [] where there are none to tell (other targets, a name that does not
    resolve)."""
    authority = ip_target_authority(target)
    if not authority:
        return []
    if target.startswith(("ipv4:", "ipv6:")):
        return [a for a in authority.split(",") if a]
    host, sep, port = authority.rpartition(":")
    if not sep or not port.isdigit():
        return []
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    out: List[str] = []
    for family, _, _, _, address in infos:
        ip = address[0]
        text = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if text not in out:
            out.append(text)
    return out


def spreads(target: str, merged_options: Sequence[Tuple[str, Any]]) -> bool:
    """Whether a channel to ``target`` with these (merged) options spreads its
    calls: round_robin over an IP target."""
    if not ip_target_authority(target):
        return False
    config = dict(merged_options).get("grpc.service_config")
    if not isinstance(config, str):
        return False
    try:
        policies = json.loads(config).get("loadBalancingConfig", [])
    except (ValueError, AttributeError):
        return False
    return bool(policies) and isinstance(policies[0], dict) and "round_robin" in policies[0]


def routed_error(error: MatmulError, home: Optional[str]) -> MatmulError:
    """A call's error: UNAVAILABLE from a handle's server (it is gone, or
    going) becomes NOT_FOUND, naming it."""
    if home is None or error.code() != grpc.StatusCode.UNAVAILABLE:
        return error
    return MatmulError(
        grpc.StatusCode.NOT_FOUND,
        f"the server holding this handle ({home}) is not reachable, and its stored "
        f"tensors are gone with it: {error.details()}",
    )


class HandleRouter:
    """Stubs for the calls that name handles: the handle's server's, or the
    spread's (``default``). ``make_channel(address)`` opens a channel to one
    server; ``make_stub(channel)`` the stub on it."""

    def __init__(
        self,
        target: str,
        merged_options: Sequence[Tuple[str, Any]],
        make_channel: Callable[[str], Any],
        make_stub: Callable[[Any], Any],
    ) -> None:
        self._enabled = spreads(target, merged_options)
        self._authority = ip_target_authority(target)
        self._make_channel = make_channel
        self._make_stub = make_stub
        self._lock = threading.Lock()
        self._homes: Dict[str, Tuple[Any, Any]] = {}

    @property
    def spreads(self) -> bool:
        """Whether the client's calls spread over several servers."""
        return self._enabled

    def home(self, *ids: Optional[str]) -> Optional[str]:
        """The server the ids name (None: the spread). MatmulError
        INVALID_ARGUMENT if they name two."""
        if not self._enabled:
            return None
        homes = {h for h in (handle_home(i) for i in ids if i) if h is not None}
        if len(homes) > 1:
            a, b = sorted(homes)
            raise MatmulError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a and b are stored on different servers ({a} and {b}): the stored "
                "operands of one multiply must live on one server (upload one near the "
                "other: the upload's `near` option)",
            )
        home = homes.pop() if homes else None
        return None if home == self._authority else home

    def stub(self, home: Optional[str], default: Any) -> Any:
        """The stub for calls to ``home`` (``default`` for None)."""
        if home is None:
            return default
        with self._lock:
            entry = self._homes.get(home)
            if entry is None:
                channel = self._make_channel(home)
                entry = (channel, self._make_stub(channel))
                self._homes[home] = entry
                if len(self._homes) > MAX_HOMES:
                    oldest = next(iter(self._homes))
                    self._homes.pop(oldest)
            return entry[1]

    def channels(self) -> list:
        with self._lock:
            return [channel for channel, _ in self._homes.values()]

    def take_channels(self) -> list:
        """The channels opened so far, forgotten (to close them)."""
        with self._lock:
            channels = [channel for channel, _ in self._homes.values()]
            self._homes.clear()
        return channels
