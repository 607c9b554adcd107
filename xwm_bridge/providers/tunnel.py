"""The upstream client's way through a forward proxy (``xwm_bridge/proxy.py`` decides
which): a TCP connection to the proxy, and for an ``https://`` target a CONNECT
tunnel, then TLS to the target inside it. The caller bounds the whole of it with the
provider's ``connect_timeout`` (proxy connect, CONNECT answer and TLS handshake).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

from xwm_bridge.providers.http1 import Connection, Http1Error
from xwm_bridge.proxy import ConnectAnswer, ProxyRoute, connect_request


class _Tunnel(asyncio.Protocol):
    """The socket while the proxy answers CONNECT."""

    def __init__(self, route: ProxyRoute, answered: asyncio.Future[ConnectAnswer]) -> None:
        self._route = route
        self._answer = ConnectAnswer()
        self._answered = answered

    def data_received(self, data: bytes) -> None:
        if self._answered.done():
            return
        try:
            if self._answer.feed(data):
                self._answered.set_result(self._answer)
        except ValueError as exc:
            msg = f"proxy {self._route.address} answered CONNECT badly: {exc}"
            self._answered.set_exception(Http1Error(msg, "connect"))

    def eof_received(self) -> bool:
        self.connection_lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._answered.done():
            msg = f"proxy {self._route.address} closed the connection before answering CONNECT"
            self._answered.set_exception(Http1Error(msg, "connect"))


async def open_via_proxy(
    route: ProxyRoute,
    host: str,
    port: int,
    tls: Callable[[], ssl.SSLContext] | None,
) -> Connection:
    """A :class:`Connection` to ``host:port`` through ``route``: the socket to the proxy
    itself for a plain target (requests go in absolute form), a CONNECT tunnel with
    TLS inside for a TLS target (``tls`` gives the context)."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[ConnectAnswer] = loop.create_future()

    def factory() -> asyncio.Protocol:
        return Connection(loop) if tls is None else _Tunnel(route, answered)

    try:
        transport, proto = await loop.create_connection(factory, route.host, route.port)
    except OSError as exc:
        raise Http1Error(route.unreachable(exc.strerror or str(exc)), "connect") from None
    if isinstance(proto, Connection):
        return proto
    try:
        await _answered(transport, answered, route, host, port)
        conn = Connection(loop)
        assert tls is not None
        secure = await loop.start_tls(transport, conn, tls(), server_hostname=host)
    except BaseException:
        answered.cancel()  # the abort below must not leave an unread failure in it
        transport.abort()
        raise
    if secure is None:  # pragma: no cover - only for a transport that cannot do TLS
        raise Http1Error(f"TLS through proxy {route.address} is not possible", "connect")
    if conn.transport is None:  # asyncio's start_tls leaves connection_made to us
        conn.connection_made(secure)
    return conn


async def _answered(
    transport: asyncio.BaseTransport,
    answered: asyncio.Future[ConnectAnswer],
    route: ProxyRoute,
    host: str,
    port: int,
) -> None:
    """Send CONNECT and wait for a 2xx (:class:`Http1Error` otherwise)."""
    # uvloop's transports implement asyncio.Transport without subclassing it
    cast(asyncio.Transport, transport).write(connect_request(route, host, port))
    answer = await answered
    if answer.status is None or not 200 <= answer.status < 300:
        raise Http1Error(route.refused(answer.status or 0), "connect")
    if answer.rest:
        raise Http1Error(f"proxy {route.address} sent data before the tunnel", "connect")


async def check_tunnel(route: ProxyRoute, host: str, port: int) -> None:
    """Open a CONNECT tunnel to ``host:port`` and close it (``doctor``); the caller
    bounds it. :class:`Http1Error` says what failed."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[ConnectAnswer] = loop.create_future()
    try:
        transport, _ = await loop.create_connection(
            lambda: _Tunnel(route, answered), route.host, route.port
        )
    except OSError as exc:
        raise Http1Error(route.unreachable(exc.strerror or str(exc)), "connect") from None
    try:
        await _answered(transport, answered, route, host, port)
    finally:
        answered.cancel()
        transport.abort()
