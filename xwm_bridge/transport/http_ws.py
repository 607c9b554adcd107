"""``GET /acp``: JSON-RPC over a WebSocket, and the client WebSockets open.

Each message is one request, run in its own task owned by the connection (at
most :data:`xwm_bridge.inflight.MAX_INFLIGHT_PER_CONNECTION` at once; past that a
request is answered ``-32004``), so ``session.cancel`` overtakes a running turn; the connection's
requests end with it. Replies and notifications leave in order through one
:class:`OrderedSender`. :class:`WebSocketHandlers` also holds every open client
WebSocket (the console's ``/console/ws`` registers its own), closed with 1001
on shutdown.
"""

from __future__ import annotations

import contextlib
import logging

import aiohttp
from aiohttp import web

from xwm_bridge import inflight as inflight_limit
from xwm_bridge import jsonrpc
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.config import Limits
from xwm_bridge.observability import rejections as rj
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.tasks import Supervisor
from xwm_bridge.transport.http_checks import CallFactory, Guard, Reject
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.wire import WireEncoder

log = logging.getLogger("xwm_bridge.http")


def frame_bytes(data: str | bytes) -> int:
    """The size on the wire of a received message's payload: a text frame's is UTF-8
    (aiohttp hands it over decoded; ``len`` of the str counted characters). An ASCII
    str (the usual JSON) is its length: ``isascii`` reads a flag, no copy."""
    if isinstance(data, str) and not data.isascii():
        return len(data.encode())
    return len(data)


class WebSocketHandlers:
    def __init__(
        self,
        dispatcher: Dispatcher,
        wire: WireEncoder,
        metrics: Metrics,
        limits: Limits,
        *,
        guard: Guard,
        call: CallFactory,
        reject: Reject,
    ) -> None:
        self.dispatcher = dispatcher
        self.wire = wire
        self.metrics = metrics
        self.limits = limits
        self._guard = guard
        self._call = call
        self._reject = reject
        self._ws_connections: set[web.WebSocketResponse] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        denied = self._guard(request, "ws")
        if denied is not None:
            return denied
        if request.method != "GET":
            return web.Response(
                status=405, text="405 method not allowed\n", content_type="text/plain"
            )
        ws = web.WebSocketResponse(
            max_msg_size=self.limits.max_ws_message_bytes,
            heartbeat=self.limits.ws_heartbeat or None,
            compress=False,
        )
        if not ws.can_prepare(request).ok:
            return web.Response(
                status=400,
                text="400 bad request: websocket upgrade required\n",
                content_type="text/plain",
            )
        await ws.prepare(request)
        self._ws_connections.add(ws)
        self.metrics.ws_connections.inc()
        sent, received = self.metrics.sent.get("ws"), self.metrics.received.get("ws")

        async def write(data: bytes) -> None:
            await ws.send_str(data.decode())  # JSON goes out as text frames
            sent.inc(len(data))

        sender = OrderedSender(write, timeout=self.limits.notification_send_timeout, wire=self.wire)
        live = LiveConnection(sender.send)
        call = self._call(request, sender.send, "ws", live)
        # the connection owns its requests: they end with it
        inflight = Supervisor()

        async def serve_one(req: jsonrpc.Request) -> None:
            reply = await self.dispatcher.handle(req, call)
            if reply is not None:
                await sender.send(reply)

        try:
            async for msg in ws:
                if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    if msg.type == aiohttp.WSMsgType.ERROR:
                        exc = ws.exception()
                        if getattr(exc, "code", None) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG:
                            self._reject(request, "ws", rj.MESSAGE_TOO_LARGE, 1009)
                        else:
                            log.info("websocket error", extra={"error": repr(exc)})
                    break
                received.inc(frame_bytes(msg.data))
                try:
                    req = jsonrpc.decode_request(msg.data)
                except jsonrpc.DecodeError as exc:
                    reason = rj.decode_reason(exc.code)
                    self._reject(request, "ws", reason, 0, error=exc.message[:200])
                    await sender.send(exc.envelope())
                    continue
                if not inflight_limit.admits(len(inflight), req.method):
                    self._reject(request, "ws", rj.TOO_MANY_INFLIGHT, 0)
                    if not req.is_notification:
                        await sender.send(inflight_limit.refusal(req.id))
                    continue
                inflight.spawn(serve_one(req), name=f"ws-request:{req.method}")
        finally:
            live.closed = True
            sender.close()
            self._ws_connections.discard(ws)
            self.metrics.ws_connections.dec()
            # A turn already running keeps going in its thread worker; queued ones are dropped.
            await inflight.shutdown(0)
        return ws

    def register(self, ws: web.WebSocketResponse) -> None:
        self._ws_connections.add(ws)
        self.metrics.ws_connections.inc()

    def unregister(self, ws: web.WebSocketResponse) -> None:
        self._ws_connections.discard(ws)
        self.metrics.ws_connections.dec()

    async def close_all(self) -> None:
        """Close every client WebSocket with 1001 (going away)."""
        for ws in list(self._ws_connections):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")
