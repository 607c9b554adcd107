"""HTTP, SSE and WebSocket edges of ``serve`` (contract.md §2-§7). No method logic here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.core.bridge import Bridge
from xwm_bridge.core.dispatcher import CallContext
from xwm_bridge.imageref import ping_fields
from xwm_bridge.sse import DONE, encode_data
from xwm_bridge.transport import bootstrap
from xwm_bridge.transport.events import stream_events
from xwm_bridge.transport.health import HealthHandlers
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.transport.security import BearerAuth, OriginPolicy, principal_of

log = logging.getLogger("xwm_bridge.http")

ROOT_TEXT = "xworkmate-bridge is running"
NOT_FOUND_TEXT = "404 page not found\n"
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept",
    "Access-Control-Max-Age": "600",
}
VARY = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")
#: requests one WebSocket connection may have in flight at once
MAX_INFLIGHT_PER_CONNECTION = 256

BRIDGE_KEY = web.AppKey("bridge", Bridge)


def _json_response(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=jsonrpc.dumps(body) + b"\n",
        content_type="application/json",
        headers=headers,
    )


def _rpc_error_response(status: int, code: int, message: str) -> web.Response:
    return _json_response(status, jsonrpc.error(None, code, message))


class HttpTransport:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        cfg = bridge.config
        self.origins = OriginPolicy(cfg.allowed_origins)
        self.auth = BearerAuth(cfg.auth_token, cfg.client_tokens)
        self.limits = cfg.limits
        self.bootstrap = bootstrap.BootstrapHandlers(bridge)
        self.health = HealthHandlers(bridge)
        self.metrics = bridge.metrics
        self._ws_connections: set[web.WebSocketResponse] = set()

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.limits.max_body_bytes,
            middlewares=[self._not_found_middleware],
        )
        app[BRIDGE_KEY] = self.bridge
        app.router.add_route("*", "/", self.root)
        app.router.add_get("/livez", self.health.livez)
        app.router.add_get("/readyz", self.health.readyz)
        app.router.add_get("/metrics", self.health.metrics)
        app.router.add_route("*", "/api/ping", self.ping)
        app.router.add_route("*", "/bridge/bootstrap/health", self.bootstrap.health)
        app.router.add_route("*", "/bridge/bootstrap/consume", self.bootstrap.consume)
        app.router.add_route("*", "/acp/rpc", self.rpc)
        app.router.add_route("*", "/acp", self.websocket)
        app.router.add_route("*", "/acp/sessions/{sessionId}/events", self.session_events)
        app.on_shutdown.append(self._on_shutdown)
        return app

    @web.middleware
    async def _not_found_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            return web.Response(status=404, text=NOT_FOUND_TEXT, content_type="text/plain")
        return response

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text=ROOT_TEXT, content_type="text/plain")

    async def ping(self, request: web.Request) -> web.Response:
        return _json_response(200, ping_fields(self.bridge.config.image))

    # --- /acp/rpc -------------------------------------------------------------------------

    def _cors(self, request: web.Request) -> dict[str, str]:
        origin = request.headers.get("Origin", "").strip()
        if origin and self.origins.allows(origin):
            return {"Access-Control-Allow-Origin": origin, **CORS_HEADERS}
        return {}

    @staticmethod
    def _apply_headers(response: web.StreamResponse, cors: dict[str, str]) -> None:
        if not cors:
            return
        response.headers.update(cors)
        for value in VARY:
            response.headers.add("Vary", value)

    def _guard(self, request: web.Request) -> web.Response | None:
        """Origin then bearer checks (contract.md §4 steps 4-5)."""
        origin = request.headers.get("Origin", "").strip()
        if not self.origins.allows(origin):
            return _rpc_error_response(
                403, jsonrpc.ORIGIN_NOT_ALLOWED, f"origin not allowed: {origin}"
            )
        if not self.auth.check(request.headers.get("Authorization")):
            return _rpc_error_response(401, jsonrpc.UNAUTHORIZED, "missing bearer authorization")
        return None

    async def rpc(self, request: web.Request) -> web.StreamResponse:
        cors = self._cors(request)
        response = await self._rpc(request, cors)
        if not response.prepared:
            self._apply_headers(response, cors)
        return response

    async def _rpc(self, request: web.Request, cors: dict[str, str]) -> web.StreamResponse:
        if request.method == "OPTIONS":
            return web.Response(status=204)
        if request.method != "POST":
            return _rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
        denied = self._guard(request)
        if denied is not None:
            return denied
        try:
            body = await asyncio.wait_for(request.read(), self.limits.request_read_timeout)
            self.metrics.bytes_in.labels("http").inc(len(body))
        except web.HTTPRequestEntityTooLarge:
            return _rpc_error_response(
                413,
                jsonrpc.INVALID_REQUEST,
                f"request body too large: limit is {self.limits.max_body_bytes} bytes",
            )
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            return _rpc_error_response(400, jsonrpc.INVALID_REQUEST, "invalid body")
        try:
            req = jsonrpc.decode_request(body)
        except jsonrpc.DecodeError as exc:
            return _rpc_error_response(400, jsonrpc.PARSE_ERROR, exc.message)

        accept = request.headers.get("Accept", "").lower()
        if "text/event-stream" not in accept:
            principal, bearer = principal_of(request.headers.get("Authorization"))
            reply = await self.bridge.dispatcher.handle(
                req, CallContext(None, "http", principal, bearer)
            )
            if reply is None:
                return web.Response(status=200)
            response = _json_response(200, reply)
            self.metrics.bytes_out.labels("http").inc(len(response.body))  # type: ignore[arg-type]
            return response
        return await self._rpc_sse(request, req, cors)

    async def _rpc_sse(
        self, request: web.Request, req: jsonrpc.Request, cors: dict[str, str]
    ) -> web.StreamResponse:
        stream = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "Connection": "keep-alive",
                "X-Accel-Buffering": "no",
            },
        )
        self._apply_headers(stream, cors)

        async def write(data: bytes) -> None:
            if not stream.prepared:
                await stream.prepare(request)
            await stream.write(data)
            self.metrics.bytes_out.labels("sse").inc(len(data))

        sender = OrderedSender(write, timeout=self.limits.notification_send_timeout)

        async def notify(message: dict[str, Any]) -> None:
            await sender.send_bytes(encode_data(jsonrpc.dumps(message)))

        principal, bearer = principal_of(request.headers.get("Authorization"))
        reply = await self.bridge.dispatcher.handle(
            req, CallContext(notify, "sse", principal, bearer)
        )
        final = DONE if reply is None else encode_data(jsonrpc.dumps(reply))
        await sender.send_bytes(final)
        if stream.prepared:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await stream.write_eof()
        return stream

    async def session_events(self, request: web.Request) -> web.StreamResponse:
        """SSE catch-up after a disconnect (issue 6; transport/events.py)."""
        cors = self._cors(request)
        if request.method == "OPTIONS":
            response: web.StreamResponse = web.Response(status=204)
        elif request.method != "GET":
            response = _rpc_error_response(405, jsonrpc.INVALID_REQUEST, "method not allowed")
        else:
            denied = self._guard(request)
            if denied is not None:
                response = denied
            else:
                extra = dict(cors)
                if cors:
                    extra["Vary"] = ", ".join(VARY)
                return await stream_events(
                    request, self.bridge, self.limits.notification_send_timeout, extra
                )
        self._apply_headers(response, cors)
        return response

    # --- /acp WebSocket ---------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        denied = self._guard(request)
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

        async def write(data: bytes) -> None:
            await ws.send_str(data.decode())
            self.metrics.bytes_out.labels("ws").inc(len(data))

        sender = OrderedSender(write, timeout=self.limits.notification_send_timeout)
        principal, bearer = principal_of(request.headers.get("Authorization"))
        live = LiveConnection(sender.send)
        call = CallContext(sender.send, "ws", principal, bearer, live)
        inflight: set[asyncio.Task[None]] = set()

        async def serve_one(req: jsonrpc.Request) -> None:
            reply = await self.bridge.dispatcher.handle(req, call)
            if reply is not None:
                await sender.send(reply)

        try:
            async for msg in ws:
                if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    if msg.type == aiohttp.WSMsgType.ERROR:
                        log.info("websocket error", extra={"error": repr(ws.exception())})
                    break
                try:
                    self.metrics.bytes_in.labels("ws").inc(len(msg.data))
                    req = jsonrpc.decode_request(msg.data)
                except jsonrpc.DecodeError as exc:
                    await sender.send(jsonrpc.error(None, jsonrpc.PARSE_ERROR, exc.message))
                    continue
                if len(inflight) >= MAX_INFLIGHT_PER_CONNECTION:
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
                task = asyncio.get_running_loop().create_task(serve_one(req))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
        finally:
            live.closed = True
            self._ws_connections.discard(ws)
            self.metrics.ws_connections.dec()
            # The connection owns its requests: they end with it. A turn already
            # running keeps going in its thread worker; queued ones are dropped.
            for task in inflight:
                task.cancel()
            if inflight:
                await asyncio.wait(inflight, timeout=5)
        return ws

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.close_websockets()

    async def close_websockets(self) -> None:
        """Close every client WebSocket with 1001 (going away); call before the runner's
        cleanup, which otherwise drops the connections without a close frame."""
        for ws in list(self._ws_connections):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")
