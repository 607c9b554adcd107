"""HTTP, SSE and WebSocket edges of ``serve`` (contract.md §2-§7). No method logic here.

The bridge's lifecycle hangs on the aiohttp application: ``cleanup_ctx`` starts
it with the app and closes it last; ``on_shutdown`` drains running turns while
client connections are still open (so their results are delivered), then
closes the client WebSockets with 1001.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from aiohttp import web

from xwm_bridge import __version__, jsonrpc
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.app.methods import BridgeMethods
from xwm_bridge.core.context import CallContext
from xwm_bridge.imageref import ping_fields
from xwm_bridge.sse import DONE, encode_data
from xwm_bridge.tasks import Supervisor
from xwm_bridge.transport import bootstrap
from xwm_bridge.transport import rejections as rj
from xwm_bridge.transport.acp_remote import PATH as ACP_REMOTE_PATH
from xwm_bridge.transport.acp_remote import AcpRemote
from xwm_bridge.transport.console import ConsoleHandlers
from xwm_bridge.transport.events import stream_events
from xwm_bridge.transport.exchange import (
    CORS_HEADERS,
    JSON_HEADERS,
    SSE_HEADERS,
    VARY,
    Reply,
    RequestView,
    StreamOut,
)
from xwm_bridge.transport.guard import ConnectionGuard
from xwm_bridge.transport.health import HealthHandlers
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.transport.security import (
    AUTH_MESSAGES,
    BearerAuth,
    OriginPolicy,
    PrincipalCache,
    peer_of,
)
from xwm_bridge.wire import WireEncoder

log = logging.getLogger("xwm_bridge.http")

ROOT_TEXT = "xworkmate-bridge is running"
NOT_FOUND_TEXT = "404 page not found\n"
KEEPALIVE = b": keep-alive\n\n"
#: requests one WebSocket connection may have in flight at once
MAX_INFLIGHT_PER_CONNECTION = 256

#: every route ``serve`` has; other front ends (agent-adapter) pick a subset
SERVE_PATHS = (
    "/",
    "/livez",
    "/readyz",
    "/metrics",
    "/api/ping",
    "/bridge/bootstrap/health",
    "/bridge/bootstrap/consume",
    "/acp/rpc",
    "/acp",
    "/acp/sessions/{sessionId}/events",
    "/console",
    "/console/",
    "/console/static/{name}",
    "/console/ws",
    ACP_REMOTE_PATH,
)

RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=jsonrpc.dumps(body) + b"\n",
        headers={**JSON_HEADERS, **headers} if headers else JSON_HEADERS,
    )


def _get_only(handler: RouteHandler) -> RouteHandler:
    async def get(request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(
                status=405, text="405 method not allowed\n", content_type="text/plain"
            )
        return await handler(request)

    return get


def _rpc_error_response(status: int, code: int, message: str) -> web.Response:
    return _web(_rpc_error(status, code, message))


def _rpc_error(status: int, code: int, message: str) -> Reply:
    return Reply(status, jsonrpc.dumps(jsonrpc.error(None, code, message)) + b"\n", JSON_HEADERS)


#: the answer to a JSON-RPC notification: 200 with no body
NO_CONTENT = Reply(200, b"", {})


def _web(reply: Reply) -> web.Response:
    if not reply.body and not reply.headers:
        return web.Response(status=reply.status)
    return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


class _AiohttpStream:
    """:class:`StreamOut` on an aiohttp ``StreamResponse``."""

    def __init__(self, request: web.Request, cors: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        HttpTransport._apply_headers(self.response, cors)

    async def write(self, data: bytes, *, last: bool = False) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        if last:
            await self.response.write_eof(data)
        else:
            await self.response.write(data)

    async def end(self) -> None:
        if self.response.prepared:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.response.write_eof()


class HttpTransport:
    def __init__(self, bridge: Bridge, dispatcher: Dispatcher) -> None:
        self.bridge = bridge
        self.dispatcher = dispatcher
        cfg = bridge.config
        self.origins = OriginPolicy(cfg.allowed_origins)
        self.auth = BearerAuth(cfg.auth_token, (*cfg.client_tokens, *cfg.admin_tokens))
        self.principals = PrincipalCache()
        self.limits = cfg.limits
        self.bootstrap = bootstrap.BootstrapHandlers(bridge)
        self.health = HealthHandlers(bridge)
        self.metrics = bridge.metrics
        #: header deadline and per-address cap; install() it on the server before serving
        self.guard = ConnectionGuard(
            head_timeout=self.limits.header_read_timeout,
            max_per_address=self.limits.max_connections_per_address,
            metrics=bridge.metrics,
        )
        #: every message to a client is encoded here: secrets redacted, never raises
        self.wire = WireEncoder(cfg.credentials())
        self._ws_connections: set[web.WebSocketResponse] = set()
        self.console = ConsoleHandlers(self)
        #: the ACP remote transport (``/acp/remote``): the bridge as an ACP agent
        self.acp = AcpRemote(
            AcpFrontDoor(bridge, BridgeMethods(bridge)),
            self._guard,
            lambda request: self.principals.of(request.headers.get("Authorization")),
            max_body=self.limits.max_body_bytes,
            max_ws_message=self.limits.max_ws_message_bytes,
            ws_heartbeat=self.limits.ws_heartbeat,
            send_timeout=self.limits.notification_send_timeout,
            read_timeout=self.limits.request_read_timeout,
        )

    def _routes(self) -> dict[str, tuple[str, RouteHandler]]:
        return {
            "/": ("*", self.root),
            "/livez": ("*", _get_only(self.health.livez)),
            "/readyz": ("*", _get_only(self.health.readyz)),
            "/metrics": ("*", _get_only(self.health.metrics)),
            "/api/ping": ("*", self.ping),
            "/bridge/bootstrap/health": ("*", self.bootstrap.health),
            "/bridge/bootstrap/consume": ("*", self.bootstrap.consume),
            "/acp/rpc": ("*", self.rpc),
            "/acp": ("*", self.websocket),
            "/acp/sessions/{sessionId}/events": ("*", self.session_events),
            "/console": ("*", self.console.page),
            "/console/": ("*", self.console.page),
            "/console/static/{name}": ("*", self.console.static),
            "/console/ws": ("*", self.console.websocket),
            ACP_REMOTE_PATH: ("*", self.acp.handle),
        }

    def app(self, paths: Iterable[str] = SERVE_PATHS) -> web.Application:
        """The aiohttp application with the given routes (contract.md §2), anything
        else 404; the bridge starts with it and stops with it."""
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        routes = self._routes()
        for path in paths:
            method, handler = routes[path]
            app.router.add_route(method, path, handler)
        app.router.add_route("*", "/{tail:.*}", self.not_found)  # last: matched in order
        app.cleanup_ctx.append(self._lifespan)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _lifespan(self, app: web.Application) -> AsyncIterator[None]:
        await self.bridge.start()
        self.bridge.supervisor.spawn(self.acp.reap(), name="acp-remote-reaper", service=True)
        try:
            yield
        finally:
            await self.bridge.close()

    async def _on_shutdown(self, app: web.Application) -> None:
        # connections are still open here: running turns deliver their results
        await self.bridge.drain()
        await self.close_websockets()
        await self.acp.close()

    async def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text=NOT_FOUND_TEXT, content_type="text/plain")

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text=ROOT_TEXT, content_type="text/plain")

    async def ping(self, request: web.Request) -> web.Response:
        # the original's fields (from IMAGE), plus this build's own version
        body = {**ping_fields(self.bridge.config.image), "packageVersion": __version__}
        return _json_response(200, body)

    # --- /acp/rpc -------------------------------------------------------------------------

    def _cors(self, request: RequestView) -> dict[str, str]:
        origin = request.headers.get("Origin", "").strip()
        if origin and self.origins.allows(origin):
            return {"Access-Control-Allow-Origin": origin, **CORS_HEADERS}
        return {}

    def cors(self, request: RequestView) -> dict[str, str]:
        """The CORS headers of an answer to ``request`` (none without an ``Origin``)."""
        return self._cors(request) if "Origin" in request.headers else {}

    @staticmethod
    def _apply_headers(response: web.StreamResponse, cors: dict[str, str]) -> None:
        if not cors:
            return
        response.headers.update(cors)
        for value in VARY:
            response.headers.add("Vary", value)

    def _reject(
        self, request: RequestView, transport: str, reason: str, status: int, **fields: Any
    ) -> None:
        """``status``: the HTTP status (a WebSocket close code, or 0 for a JSON-RPC
        error on an open socket, is logged as ``ws_close`` / not at all)."""
        if status >= 1000:
            fields["ws_close"] = status
        elif status:
            fields["status"] = status
        rj.reject(
            self.metrics,
            transport,
            reason,
            path=request.path,
            remote=request.remote or "",
            **fields,
        )

    def denied(self, request: RequestView, transport: str = "http") -> Reply | None:
        """Origin then bearer checks (contract.md §4 steps 4-5): the refusal, or None."""
        origin = request.headers.get("Origin", "").strip()
        if origin and not self.origins.allows(origin):
            self._reject(request, transport, rj.ORIGIN, 403, origin=origin[:200])
            return _rpc_error(403, jsonrpc.ORIGIN_NOT_ALLOWED, f"origin not allowed: {origin}")
        why = self.auth.verify(request.headers.get("Authorization"))
        if why:
            self._reject(request, transport, why, 401)
            return _rpc_error(401, jsonrpc.UNAUTHORIZED, AUTH_MESSAGES[why])
        return None

    def _guard(self, request: web.Request, transport: str = "http") -> web.Response | None:
        denied = self.denied(request, transport)
        return None if denied is None else _web(denied)

    def body_too_large(self, request: RequestView) -> Reply:
        self._reject(request, "http", rj.BODY_TOO_LARGE, 413)
        return _rpc_error(
            413,
            jsonrpc.INVALID_REQUEST,
            f"request body too large: limit is {self.limits.max_body_bytes} bytes",
        )

    def bad_request(self, request: RequestView, reason: str, status: int) -> Reply:
        """A request the front's HTTP parser refused (``rj.BAD_REQUEST``, 400) or whose
        head is too large (``rj.HEAD_TOO_LARGE``, 431)."""
        self._reject(request, "http", reason, status)
        text = "400 bad request" if status == 400 else "431 request header fields too large"
        return Reply(status, text.encode() + b"\n", {"Content-Type": "text/plain"})

    def bad_body(self, request: RequestView) -> Reply:
        self._reject(request, "http", rj.BAD_BODY, 400)
        return _rpc_error(400, jsonrpc.INVALID_REQUEST, "invalid body")

    def _call(
        self,
        request: RequestView,
        notify: Any,
        transport: str,
        connection: Any = None,
        *,
        notify_many: Any = None,
    ) -> CallContext:
        principal, bearer = self.principals.of(request.headers.get("Authorization"))
        return CallContext(
            notify,
            transport,
            principal,
            bearer,
            connection,
            peer_of(request),
            notify_many=notify_many,
        )

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        cors = self.cors(request)
        response = await self._rpc(request, cors)
        if cors and not response.prepared:
            self._apply_headers(response, cors)
        return response

    async def _rpc(self, request: web.Request, cors: dict[str, str]) -> web.StreamResponse:
        if request.method != "POST":
            if request.method == "OPTIONS":
                return web.Response(status=204)
            self._reject(request, "http", rj.METHOD_NOT_ALLOWED, 405, method=request.method)
            return _rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
        denied = self._guard(request)
        if denied is not None:
            return denied
        try:
            if request.content.is_eof():  # all of it has arrived: no wait, so no timer
                body = await request.read()
            else:
                async with asyncio.timeout(self.limits.request_read_timeout):
                    body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _web(self.body_too_large(request))
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return _web(self.bad_body(request))
        stream = _AiohttpStream(request, cors)
        reply = await self.answer(request, body, stream)
        return stream.response if reply is None else _web(reply)

    async def answer(self, request: RequestView, body: bytes, stream: StreamOut) -> Reply | None:
        """Answer an admitted ``POST /acp/rpc`` whose whole body is ``body``: the
        reply, or None when it was written to ``stream`` (SSE)."""
        self.metrics.received.get("http").inc(len(body))
        try:
            req = jsonrpc.decode_request(body)
        except jsonrpc.DecodeError as exc:
            reason = rj.decode_reason(exc.code)
            self._reject(request, "http", reason, 400, error=exc.message[:200])
            return Reply(400, jsonrpc.dumps(exc.envelope()) + b"\n", JSON_HEADERS)

        if "text/event-stream" not in request.headers.get("Accept", "").lower():
            reply = await self.dispatcher.handle(req, self._call(request, None, "http"))
            if reply is None:
                return NO_CONTENT
            encoded = self.wire.encode(reply)
            assert encoded is not None  # a response always encodes (or becomes -32603)
            data = encoded + b"\n"
            self.metrics.sent.get("http").inc(len(data))
            return Reply(200, data, JSON_HEADERS)
        await self._rpc_sse(request, req, stream)
        return None

    async def _rpc_sse(self, request: RequestView, req: jsonrpc.Request, stream: StreamOut) -> None:
        sent = self.metrics.sent.get("sse")
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        final: bytes | None = None  # the final message carries the end of the answer

        async def write(data: bytes) -> None:
            nonlocal last_write
            await stream.write(data, last=data is final)
            last_write = loop.time()
            sent.inc(len(data))

        sender = OrderedSender(write, timeout=self.limits.notification_send_timeout)
        wire = self.wire

        async def notify(message: dict[str, Any]) -> None:
            data = wire.encode(message)
            if data is not None:
                await sender.send_bytes(encode_data(data))

        async def notify_many(messages: list[dict[str, Any]]) -> None:
            # the frames of one upstream read leave in one chunk: one write, not one each;
            # through the wire encoder (secrets redacted, never raises)
            data = wire.events(messages)
            if data:
                await sender.send_bytes(data)

        async def keepalive(interval: float) -> None:
            # a comment line after `interval` seconds of silence, so that proxies with
            # idle timeouts (60-100 s is common) do not cut a long, quiet turn
            while not sender.broken:
                idle = loop.time() - last_write
                if idle < interval:
                    await asyncio.sleep(interval - idle)
                    continue
                await sender.send_bytes(KEEPALIVE)

        call = self._call(request, notify, "sse", notify_many=notify_many)
        interval = self.limits.sse_keepalive
        if interval > 0:
            async with asyncio.TaskGroup() as group:  # the keep-alive ends with the call
                beat = group.create_task(keepalive(interval), name="sse-keepalive")
                try:
                    reply = await self.dispatcher.handle(req, call)
                finally:
                    beat.cancel()
        else:
            reply = await self.dispatcher.handle(req, call)
        encoded = None if reply is None else wire.encode(reply)
        final = DONE if encoded is None else encode_data(encoded)

        await sender.send_bytes(final)
        sender.close()
        await stream.end()

    async def session_events(self, request: web.Request) -> web.StreamResponse:
        """SSE catch-up after a disconnect (transport/events.py)."""
        cors = self._cors(request)
        if request.method == "OPTIONS":
            response: web.StreamResponse = web.Response(status=204)
        elif request.method != "GET":
            self._reject(request, "sse", rj.METHOD_NOT_ALLOWED, 405, method=request.method)
            response = _rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
        else:
            denied = self._guard(request, "sse")
            if denied is not None:
                response = denied
            else:
                extra = dict(cors)
                if cors:
                    extra["Vary"] = ", ".join(VARY)
                principal, _ = self.principals.of(request.headers.get("Authorization"))
                return await stream_events(
                    request,
                    self.bridge,
                    self.limits.notification_send_timeout,
                    extra,
                    self.wire,
                    principal,
                )
        self._apply_headers(response, cors)
        return response

    # --- /acp WebSocket ---------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
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
                received.inc(len(msg.data))
                try:
                    req = jsonrpc.decode_request(msg.data)
                except jsonrpc.DecodeError as exc:
                    reason = rj.decode_reason(exc.code)
                    self._reject(request, "ws", reason, 0, error=exc.message[:200])
                    await sender.send(exc.envelope())
                    continue
                if len(inflight) >= MAX_INFLIGHT_PER_CONNECTION:
                    self._reject(request, "ws", rj.TOO_MANY_INFLIGHT, 0)
                    if not req.is_notification:
                        await sender.send(
                            jsonrpc.error(
                                req.id,
                                jsonrpc.QUEUE_FULL,
                                f"too many requests in flight on this connection "
                                f"(limit {MAX_INFLIGHT_PER_CONNECTION})",
                            )
                        )
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

    def register_ws(self, ws: web.WebSocketResponse) -> None:
        self._ws_connections.add(ws)
        self.metrics.ws_connections.inc()

    def unregister_ws(self, ws: web.WebSocketResponse) -> None:
        self._ws_connections.discard(ws)
        self.metrics.ws_connections.dec()

    async def close_websockets(self) -> None:
        """Close every client WebSocket with 1001 (going away)."""
        for ws in list(self._ws_connections):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")
