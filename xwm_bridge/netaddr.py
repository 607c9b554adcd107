"""Listen addresses: ``HOST:PORT`` parsing and the loopback test (sans-I/O)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit


def parse_listen(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) → (host, port); ValueError if malformed."""
    value = addr.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {addr!r}")
    return _listen_host(host, addr), port


#: a host name as a listen address may give it (letters, digits, ``.``, ``-``, ``_``)
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _listen_host(host: str, addr: str) -> str:
    """The host part of a listen address, checked here so a malformed one is a config
    error naming it, not a bind failure (or a "non-loopback" refusal) later."""
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else None
        try:
            if inner is None:
                raise ValueError
            ipaddress.IPv6Address(inner)
        except ValueError:
            raise ValueError(f"expected HOST:PORT ([IPv6]:PORT), got {addr!r}") from None
        return inner
    if ":" in host:
        raise ValueError(f"an IPv6 host needs brackets, e.g. [::1]:8787, got {addr!r}")
    if host and not _HOST_NAME.fullmatch(host):
        raise ValueError(f"not a host name or IP address: {host!r} in {addr!r}")
    return host


def is_loopback_host(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ANY_HOST = "*"


def _split_entry(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 → (host, port);
    an entry whose port is not ASCII digits stays whole (it allows nothing)."""
    value = entry.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if not rest:
            return host, None
        port = rest[1:] if rest.startswith(":") else ""
        return (host, int(port)) if port.isascii() and port.isdigit() else (value, None)
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        if port.isascii() and port.isdigit():
            return host, int(port)
    return value, None


class HostPolicy:
    """Which ``host:port`` a client may make the bridge dial (issue 16 item 10).

    ``entries`` from config win when given (``host`` = any port, ``host:port``
    exact, ``*`` = anything); without them, loopback on any port plus the
    ``defaults`` (the endpoints the operator configured, ``host:port``). Names
    are compared as written (case-insensitive), never resolved.
    """

    def __init__(self, entries: tuple[str, ...], defaults: tuple[str, ...] = ()) -> None:
        self.configured = bool(entries)
        rules = [_split_entry(e) for e in (entries or defaults) if e.strip()]
        self.any = any(host == ANY_HOST for host, _ in rules)
        self._rules = {(host, port) for host, port in rules}

    def allows(self, host: str, port: int) -> bool:
        name = host.strip().strip("[]").lower()
        if self.any:
            return True
        if not self.configured and is_loopback_host(name):
            return True
        return (name, None) in self._rules or (name, port) in self._rules


def endpoint_of(url: str) -> str:
    """``host:port`` of a URL (default port of its scheme), ``""`` if it has no host."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return ""
    host = parts.hostname or ""
    if not host:
        return ""
    port = port or {"http": 80, "ws": 80, "https": 443, "wss": 443}.get(parts.scheme, 0)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
