"""One connect attempt of a runtime (gateway.md §3, §8.1): the dial and handshake
(``dial.connect`` over a ``protocol.Handshake``), and what each step of it tells
clients — the ``connecting``, ``connected`` and failed snapshots and their log lines.

The runtime keeps the state (its socket, hello, config); these take it explicitly.
"""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import dial
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig
from xwm_bridge.gateway.ignored import IgnoredFrames
from xwm_bridge.gateway.notices import Notices, now_ms
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.requests import Requests
from xwm_bridge.gateway.snapshot import Snapshot
from xwm_bridge.proxy import ProxySettings


async def attempt(
    cfg: ConnectConfig,
    *,
    settings: GatewayConfig,
    runtime_id: str,
    proxies: ProxySettings | None,
    requests: Requests,
    ignored: IgnoredFrames,
) -> tuple[ClientConnection, p.Hello]:
    """Dial + handshake: the open socket and its ``hello-ok``, or raise
    :class:`GatewayError`."""
    ignored.new_socket()  # its handshake's dropped frames count for it too
    return await dial.connect(
        cfg.url,
        p.Handshake(
            cfg.client,
            cfg.identity,
            cfg.creds,
            request_id=requests.ids.next(),
            clock_ms=now_ms,
        ),
        settings,
        runtime_id,
        proxies,
        ignored.note,
    )


def connecting(snapshot: Snapshot, cfg: ConnectConfig, notices: Notices) -> None:
    """A client connect starts: its attempt line, then the ``connecting`` snapshot."""
    fields = ", ".join(cfg.auth_fields) or "none"
    sources = " · ".join(cfg.auth_sources) or "none"
    notices.log(
        "info",
        "connect",
        f"attempt {cfg.remote_address} tls:{str(cfg.url.startswith('wss')).lower()} | "
        f"auth: {cfg.auth_mode} | fields: {fields} | sources: {sources}",
    )
    snapshot.status, snapshot.status_text = "connecting", "Connecting…"
    snapshot.remote_address = cfg.remote_address
    notices.snapshot(snapshot)


def connected(snapshot: Snapshot, cfg: ConnectConfig, hello: p.Hello, notices: Notices) -> None:
    """The ``connected`` snapshot (``cfg`` with the hello's device token, if any) and
    its log line."""
    snap = snapshot
    snap.status, snap.status_text = "connected", "Connected"
    snap.remote_address = cfg.remote_address
    snap.auth_scopes = hello.scopes
    snap.auth_role = hello.role
    snap.server_name = hello.server_name
    snap.main_session_key = hello.main_session_key
    snap.last_connected_at_ms = now_ms()
    snap.has_device_token = cfg.has_device_token or bool(cfg.creds.device_token)
    snap.protocol = hello.protocol
    snap.last_error = snap.last_error_code = snap.last_error_detail_code = ""
    notices.snapshot(snap)
    notices.log(
        "info",
        "connect",
        f"connected {cfg.remote_address} | role: {hello.role} | scopes: {len(hello.scopes)}"
        f" | protocol: {hello.protocol}",
    )


def failed(snapshot: Snapshot, cfg: ConnectConfig, exc: GatewayError, notices: Notices) -> None:
    """An attempt failed: its log lines (a fatal error also says no reconnect follows)
    and the ``error`` snapshot."""
    code, detail = exc.code or "unknown", exc.detail_code or "none"
    if exc.fatal:
        notices.log(
            "warn", "socket", f"auto reconnect suppressed | code: {code} | detail: {detail}"
        )
    notices.log(
        "error",
        "connect",
        f"failed {cfg.remote_address} | code: {code} | detail: {detail} | message: {exc}",
    )
    snap = snapshot
    snap.status, snap.status_text = "error", "Connection failed"
    snap.last_error, snap.last_error_code = exc.message, exc.code
    snap.last_error_detail_code = exc.detail_code
    notices.snapshot(snap)
