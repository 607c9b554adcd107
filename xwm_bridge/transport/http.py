"""The aiohttp application of ``serve`` (contract.md §2-§7): its route table, the
``/acp/rpc`` route and the SSE catch-up route. No method logic here.

The other edges have their own modules: the checks of every request (origin,
bearer, CORS, refusals) ``http_checks.py``, the base of :class:`HttpTransport`;
the SSE answer to ``/acp/rpc`` ``http_sse.py``; the ``/acp`` WebSocket
``http_ws.py``; the catch-up stream ``events.py``.

The bridge's lifecycle hangs on the aiohttp application: ``cleanup_ctx`` starts
it with the app and closes it last; ``on_shutdown`` drains running turns while
client connections are still open (so their results are delivered), then
closes the client WebSockets with 1001.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.web_urldispatcher import _default_expect_handler

from xwm_bridge import __version__, jsonrpc
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.app.methods import BridgeMethods
from xwm_bridge.codings import announced
from xwm_bridge.imageref import ping_fields
from xwm_bridge.observability import rejections as rj
from xwm_bridge.transport import bootstrap
from xwm_bridge.transport.acp_remote import PATH as ACP_REMOTE_PATH
from xwm_bridge.transport.acp_remote import AcpRemote
from xwm_bridge.transport.console import ConsoleHandlers
from xwm_bridge.transport.events import stream_events
from xwm_bridge.transport.exchange import (
    JSON_HEADERS,
    VARY,
    Reply,
    RequestView,
    StreamOut,
)
from xwm_bridge.transport.guard import ConnectionGuard
from xwm_bridge.transport.health import HealthHandlers
from xwm_bridge.transport.http_checks import (
    HttpChecks,
    apply_cors,
    rpc_error_response,
    web_reply,
)
from xwm_bridge.transport.http_sse import AiohttpStream, SseAnswers
from xwm_bridge.transport.http_ws import WebSocketHandlers
from xwm_bridge.wire import WireEncoder

ROOT_TEXT = "xworkmate-bridge is running"
NOT_FOUND_TEXT = "404 page not found\n"

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


#: the answer to a JSON-RPC notification: 200 with no body
NO_CONTENT = Reply(200, b"", {})


class HttpTransport(HttpChecks):
    def __init__(self, bridge: Bridge, dispatcher: Dispatcher) -> None:
        self.bridge = bridge
        self.dispatcher = dispatcher
        cfg = bridge.config
        super().__init__(cfg, bridge.metrics)  # origins, auth, principals, limits, metrics
        self.bootstrap = bootstrap.BootstrapHandlers(bridge)
        self.health = HealthHandlers(bridge)
        #: header deadline, per-address cap and send deadline; install() it on the server
        #: before serving
        self.guard = ConnectionGuard(
            head_timeout=self.limits.header_read_timeout,
            max_per_address=self.limits.max_connections_per_address,
            send_timeout=self.limits.notification_send_timeout,
            metrics=bridge.metrics,
        )
        #: every message to a client is encoded here: secrets redacted, never raises
        self.wire = WireEncoder(cfg.credentials())
        #: the SSE answers of ``/acp/rpc``
        self.sse = SseAnswers(dispatcher, self.wire, self.metrics, self.limits, call=self._call)
        #: ``/acp``, and every open client WebSocket (closed with 1001 on shutdown)
        self.websockets = WebSocketHandlers(
            dispatcher,
            self.wire,
            self.metrics,
            self.limits,
            guard=self._guard,
            call=self._call,
            reject=self._reject,
        )
        self.console = ConsoleHandlers(self)
        #: the ACP remote transport (``/acp/remote``): the bridge as an ACP agent
        self.acp = AcpRemote(
            AcpFrontDoor(bridge, BridgeMethods(bridge)),
            self._guard,
            lambda request: self.principals.of(request.headers.get("Authorization")),
            reject=self._reject,
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
            "/acp": ("*", self.websockets.handle),
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
        app = web.Application(
            client_max_size=self.limits.max_body_bytes,
            middlewares=[self.framed, self.served] if self.hosts.active else [self.framed],
        )
        routes = self._routes()
        for path in paths:
            method, handler = routes[path]
            expect = self.rpc_expect if path == "/acp/rpc" else self.route_expect
            app.router.add_route(method, path, handler, expect_handler=expect)
        # last: matched in order
        app.router.add_route("*", "/{tail:.*}", self.not_found, expect_handler=self.route_expect)
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
        # catch-up streams that follow a session end once they have what the drain wrote
        self.bridge.sessions.feed.end_all()
        await self.websockets.close_all()
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

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        cors = self.cors(request)
        response = await self._rpc(request, cors)
        if cors and not response.prepared:
            apply_cors(response, cors)
        return response

    async def _rpc(self, request: web.Request, cors: dict[str, str]) -> web.StreamResponse:
        if request.method != "POST":
            if request.method == "OPTIONS":
                return web.Response(status=204)
            self._reject(request, "http", rj.METHOD_NOT_ALLOWED, 405, method=request.method)
            return rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
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
            return web_reply(self.body_too_large(request))
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return web_reply(self.bad_body(request))
        stream = AiohttpStream(request, cors)
        reply = await self.answer(request, body, stream)
        return stream.response if reply is None else web_reply(reply)

    async def rpc_expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` on ``/acp/rpc`` (the front hands every ``Expect`` to
        aiohttp): a request that will be refused (Host, origin, bearer, a
        ``Content-Length`` over the limit) gets its refusal instead of ``100 Continue``
        with ``Connection: close``, so the body it announced is never invited (aiohttp
        then waits its lingering time, 10 s at most, for a client that sends it anyway)."""
        unframed = self.unframed(request)
        if unframed is not None:  # before the 100 (the middleware comes after it)
            return unframed
        if request.method == "POST":
            reply = self.denied(request)
            length = announced(request.headers.get("Content-Length"))  # not int(): 4300 digits
            if reply is None and length > self.limits.max_body_bytes:
                reply = self.body_too_large(request)
            if reply is not None:
                response = web_reply(reply)
                apply_cors(response, self.cors(request))
                response.force_close()
                return response
        await _default_expect_handler(request)  # 100 Continue (417 for another Expect)
        return None

    async def route_expect(self, request: web.Request) -> web.StreamResponse | None:
        """``Expect: 100-continue`` on every other route: the refusals every route gets
        (:meth:`unframed`, a foreign ``Host``) instead of ``100 Continue`` before them,
        as :meth:`rpc_expect` (the middlewares run only after the 100)."""
        refused = self.unframed(request)
        if refused is None and self.hosts.refuses(request.headers.get("Host")):
            upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
            refused = web_reply(self.misdirected(request, "ws" if upgrade else "http"))
            refused.force_close()
        if refused is not None:
            return refused
        await _default_expect_handler(request)  # 100 Continue (417 for another Expect)
        return None

    async def answer(self, request: RequestView, body: bytes, stream: StreamOut) -> Reply | None:
        """Answer an admitted ``POST /acp/rpc`` whose whole body is ``body``: the
        reply, or None when it was written to ``stream`` (SSE, ``http_sse.py``)."""
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
        await self.sse.answer(request, req, stream)
        return None

    async def session_events(self, request: web.Request) -> web.StreamResponse:
        """SSE catch-up after a disconnect (transport/events.py)."""
        cors = self._cors(request)
        if request.method == "OPTIONS":
            response: web.StreamResponse = web.Response(status=204)
        elif request.method != "GET":
            self._reject(request, "sse", rj.METHOD_NOT_ALLOWED, 405, method=request.method)
            response = rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
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
        apply_cors(response, cors)
        return response
