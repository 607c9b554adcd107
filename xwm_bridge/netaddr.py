"""Listen addresses: ``HOST:PORT`` parsing and the loopback test (sans-I/O)."""

from __future__ import annotations

import ipaddress


def parse_listen(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) → (host, port); ValueError if malformed."""
    value = addr.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected HOST:PORT, got {addr!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range in {addr!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def is_loopback_host(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
