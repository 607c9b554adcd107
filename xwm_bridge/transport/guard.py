"""Connection limits aiohttp has no setting for (issue 16 item 9): slow and greedy clients.

* **header deadline** — a new connection must deliver its first complete
  request head within ``limits.header_read_timeout`` seconds, or it is
  answered ``408`` and closed (slowloris: a few bytes of header now and then
  kept a connection open for as long as the client liked). Later requests on a
  kept-alive connection are bounded by ``limits.keepalive_timeout``, which
  aiohttp applies to a connection without a complete request head;
* **per-address cap** — at most ``limits.max_connections_per_address`` open
  connections (plain, SSE and WebSocket alike) per client IP; one more is
  answered ``503`` and closed at once. Behind a reverse proxy every client has
  the proxy's address: raise the cap, or set 0 (off);
* **send deadline** — a connection whose writes stay paused (the client takes
  none of the bytes buffered for it) for ``limits.notification_send_timeout``
  seconds is aborted. Closing it is not enough: a transport closes only once its
  buffer is written, so a client that stopped reading kept the socket, its slot
  under the cap and its buffered answer for good (``front.py`` reports the
  pauses; aiohttp's own server, when there is no front, does not);
* body deadlines are the route's (``limits.request_read_timeout``).

The guard hooks the three calls aiohttp's ``web.Server`` makes for every
connection and every request (``connection_made``, ``connection_lost`` and the
request factory); it is installed on the server before it accepts anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from xwm_bridge.observability.metrics import Metrics

log = logging.getLogger("xwm_bridge.http")


def _response(status: str, text: str) -> bytes:
    body = text.encode() + b"\n"
    head = f"HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body


REFUSED = _response("503 Service Unavailable", "503 too many connections from this address")
TIMED_OUT = _response("408 Request Timeout", "408 request header not received in time")
#: at most one log line per reason per this many seconds (a flood must not flood the log)
LOG_EVERY = 1.0
#: after the header deadline, how long a head already received may take to reach the
#: request factory before the connection is closed
GRACE_S = 0.2


@dataclass(slots=True)
class _Conn:
    address: str
    transport: asyncio.Transport
    timer: asyncio.TimerHandle | None
    #: when its writes were paused (None: they are not), and the timer that checks
    stalled_since: float | None = None
    stall_timer: asyncio.TimerHandle | None = None


class ConnectionGuard:
    def __init__(
        self,
        *,
        head_timeout: float,
        max_per_address: int,
        send_timeout: float = 0.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.head_timeout = head_timeout
        self.max_per_address = max_per_address
        self.send_timeout = send_timeout
        self._metrics = metrics
        self._conns: dict[Any, _Conn] = {}
        self._per_address: dict[str, int] = {}
        self._logged: dict[str, float] = {}
        #: connections closed by a limit, by reason (``per_address``, ``header_timeout``,
        #: ``send_timeout``)
        self.closed: dict[str, int] = {}

    def open_count(self, address: str) -> int:
        return self._per_address.get(address, 0)

    def install(self, server: web.Server) -> None:
        """Wrap ``server``'s per-connection hooks; call before it accepts connections."""
        made, lost, factory = server.connection_made, server.connection_lost, server.request_factory

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self._lost(handler)
            lost(handler, exc)

        def request_factory(message: Any, payload: Any, protocol: Any, *rest: Any) -> Any:
            self._head(protocol)
            return factory(message, payload, protocol, *rest)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]
        server.request_factory = request_factory

    # --- the hooks (``front.py`` calls them for its connections) ----------------------------

    def opened(self, handler: Any, transport: asyncio.Transport) -> bool:
        """A connection is open: False when it was refused (answered 503 and closed)."""
        return self._opened(handler, transport)

    def head(self, handler: Any) -> None:
        """Its first request head is in: the header deadline no longer applies."""
        self._head(handler)

    def lost(self, handler: Any) -> None:
        self._lost(handler)

    def paused(self, handler: Any) -> None:
        """Its writes are paused: the client must take data again within the send deadline.

        One timer per stall, not per pause: it is armed when none is pending and, when
        it fires, re-armed for the latest pause if writes resumed meanwhile."""
        conn = self._conns.get(handler)
        if conn is None or self.send_timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        conn.stalled_since = now = loop.time()
        if conn.stall_timer is None:
            conn.stall_timer = loop.call_at(now + self.send_timeout, self._stall_check, handler)

    def resumed(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is not None:
            conn.stalled_since = None

    def _opened(self, handler: Any, transport: asyncio.Transport) -> bool:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        count = self._per_address.get(address, 0)
        if self.max_per_address and count >= self.max_per_address:
            self._count("per_address", address, count)
            transport.write(REFUSED)
            transport.close()
            return False
        self._per_address[address] = count + 1
        timer = None
        if self.head_timeout > 0:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(self.head_timeout, self._expire, handler)
        self._conns[handler] = _Conn(address, transport, timer)
        return True

    def _head(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is not None and conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None

    def _expire(self, handler: Any) -> None:
        """The deadline passed. A head that arrived in this very loop iteration is not
        seen by the request factory yet: decide a moment later."""
        conn = self._conns.get(handler)
        if conn is None or conn.timer is None:
            return
        conn.timer = asyncio.get_running_loop().call_later(GRACE_S, self._close_slow, handler)

    def _close_slow(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is None or conn.timer is None:
            return  # its head came in the meantime
        conn.timer = None
        self._count("header_timeout", conn.address, self._per_address.get(conn.address, 0))
        if not conn.transport.is_closing():
            conn.transport.write(TIMED_OUT)
            conn.transport.close()

    def _stall_check(self, handler: Any) -> None:
        conn = self._conns.get(handler)
        if conn is None:
            return
        conn.stall_timer = None
        since = conn.stalled_since
        if since is None:
            return  # writing again: the next pause arms it
        loop = asyncio.get_running_loop()
        due = since + self.send_timeout
        if loop.time() < due:
            conn.stall_timer = loop.call_at(due, self._stall_check, handler)
            return
        self._count("send_timeout", conn.address, self._per_address.get(conn.address, 0))
        conn.transport.abort()  # connection_lost follows: the slot and the buffer go

    def _lost(self, handler: Any) -> None:
        conn = self._conns.pop(handler, None)
        if conn is None:
            return  # refused at once: never counted
        if conn.timer is not None:
            conn.timer.cancel()
        if conn.stall_timer is not None:
            conn.stall_timer.cancel()
        left = self._per_address.get(conn.address, 0) - 1
        if left > 0:
            self._per_address[conn.address] = left
        else:
            self._per_address.pop(conn.address, None)

    def _count(self, reason: str, address: str, open_now: int) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1
        if self._metrics is not None:
            self._metrics.connections_closed.get(reason).inc()
        now = time.monotonic()
        if now - self._logged.get(reason, 0.0) >= LOG_EVERY:
            self._logged[reason] = now
            log.warning(
                "closing a client connection",
                extra={
                    "reason": reason,
                    "address": address,
                    "open_from_address": open_now,
                    "closed_so_far": self.closed[reason],
                },
            )
