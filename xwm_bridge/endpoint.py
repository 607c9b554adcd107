"""Upstream endpoint derivation (forwarding.md §4.3). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class EndpointError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Endpoint:
    transport: str  # "http" or "ws"
    http_url: str
    ws_url: str

    @property
    def url(self) -> str:
        return self.http_url if self.transport == "http" else self.ws_url


_HTTP_OF = {"ws": "http", "wss": "https", "http": "http", "https": "https"}
_WS_OF = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}


def derive_endpoint(raw: str) -> Endpoint:
    value = raw.strip()
    if not value:
        raise EndpointError("missing external ACP endpoint")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise EndpointError(str(exc)) from None
    scheme = parts.scheme.lower()
    if not scheme or not parts.hostname:
        raise EndpointError(f"endpoint must be an absolute URI: {value}")
    if scheme not in _HTTP_OF:
        raise EndpointError(f"unsupported external ACP scheme: {scheme}")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    hostport = f"{host}:{port}" if port is not None else host
    base = parts.path.rstrip("/")
    if base.endswith("/acp/rpc"):
        base = base[: -len("/acp/rpc")]
    elif base.endswith("/acp"):
        base = base[: -len("/acp")]
    base = base.rstrip("/")
    http_url = f"{_HTTP_OF[scheme]}://{hostport}{base}/acp/rpc"
    ws_url = f"{_WS_OF[scheme]}://{hostport}{base}/acp"
    transport = "http" if scheme in ("http", "https") else "ws"
    return Endpoint(transport=transport, http_url=http_url, ws_url=ws_url)
