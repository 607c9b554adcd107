"""``/acp/remote``: the ACP remote transport of ``serve`` (the Streamable HTTP &
WebSocket RFD), on the same auth, origin and size rules as ``/acp/rpc``.

``GET`` with ``Upgrade: websocket`` → one ACP connection on a WebSocket (text
frames, the ``Acp-Connection-Id`` on the 101 response). Otherwise Streamable HTTP:
``POST`` a message (``initialize`` answers 200 with the result and a new
``Acp-Connection-Id``; everything else 202), ``GET`` with ``Accept:
text/event-stream`` opens the connection's stream (``Acp-Connection-Id``) or a
session's (plus ``Acp-Session-Id``), ``DELETE`` ends the connection. Streams send
``: keep-alive`` every 15 s. A dropped connection's turns go on; ``session/load``
or ``session/resume`` from a new connection picks them up. HTTP/1.1 is served as
is (each stream its own TCP connection); put an HTTP/2 proxy in front where the
RFD's HTTP/2 matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.acp import codec
from xwm_bridge.acp.connection import SESSION_SCOPED, AcpConnection
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.acp.remote import END, Outbox, RemoteConnection
from xwm_bridge.acp.sessions import OWNER_KEY
from xwm_bridge.core.context import CallContext
from xwm_bridge.observability import rejections as rj
from xwm_bridge.tasks import wait_for
from xwm_bridge.transport.exchange import SSE_KEEPALIVE, sse_headers
from xwm_bridge.transport.http_checks import Reject
from xwm_bridge.transport.notify import OrderedSender

log = logging.getLogger("xwm_bridge.acp")

PATH = "/acp/remote"
CONNECTION_HEADER = "Acp-Connection-Id"
SESSION_HEADER = "Acp-Session-Id"
REAP_INTERVAL = 30.0

#: the origin and bearer checks (``HttpChecks._guard``), given the refusal's transport label
Guard = Callable[[web.Request, str], web.Response | None]
Principal = Callable[[web.Request], tuple[str, str]]


def _error(status: int, message: str, code: int = jsonrpc.INVALID_REQUEST) -> web.Response:
    return web.Response(
        status=status,
        body=jsonrpc.dumps(jsonrpc.error(None, code, message)) + b"\n",
        content_type="application/json",
    )


class AcpRemote:
    def __init__(
        self,
        front: AcpFrontDoor,
        guard: Guard,
        principal: Principal,
        *,
        reject: Reject,
        max_body: int,
        max_ws_message: int,
        ws_heartbeat: float,
        send_timeout: float,
        read_timeout: float,
    ) -> None:
        self.front = front
        self._guard = guard
        self._principal = principal
        #: counts and logs a refused body or frame (``xwm_rejected_requests_total``)
        self._reject = reject
        self._max_body = max_body
        self._max_ws_message = max_ws_message
        self._ws_heartbeat = ws_heartbeat
        self._send_timeout = send_timeout
        self._read_timeout = read_timeout
        cfg = front.config.acp
        self._max_connections = cfg.max_connections
        self._idle_ttl = cfg.connection_idle_ttl
        self._buffer = cfg.stream_buffer
        self.http: dict[str, RemoteConnection] = {}
        self.websockets: set[web.WebSocketResponse] = set()
        self._streams: set[web.StreamResponse] = set()
        self._closing = False

    @property
    def open_connections(self) -> int:
        return len(self.http) + len(self.websockets)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        denied = self._guard(request, "ws" if upgrade else "http")
        if denied is not None:
            return denied
        if self._closing:
            return _error(503, "bridge is shutting down", jsonrpc.SHUTTING_DOWN)
        if request.method == "GET":
            if upgrade:
                return await self.websocket(request)
            return await self.stream(request)
        if request.method == "POST":
            return await self.post(request)
        if request.method == "DELETE":
            return await self.delete(request)
        return web.Response(status=405, text="405 method not allowed\n", content_type="text/plain")

    def _full(self, request: web.Request, transport: str) -> web.Response | None:
        if self.open_connections >= self._max_connections:
            self._reject(request, transport, rj.TOO_MANY_CONNECTIONS, 503)
            return _error(
                503, f"too many ACP connections (limit {self._max_connections})", jsonrpc.QUEUE_FULL
            )
        return None

    # --- WebSocket ---------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        full = self._full(request, "ws")
        if full is not None:
            return full
        ws = web.WebSocketResponse(
            max_msg_size=self._max_ws_message, heartbeat=self._ws_heartbeat or None, compress=False
        )
        if not ws.can_prepare(request).ok:
            return _error(400, "websocket upgrade required")
        principal, bearer = self._principal(request)
        sender = OrderedSender(lambda data: ws.send_str(data.decode()), timeout=self._send_timeout)

        wire = self.front.wire

        async def send(message: dict[str, Any], scope: str | None) -> None:
            data = wire.encode(message)  # secrets redacted; never raises
            if data is not None:
                await sender.send_bytes(data)

        conn = self.front.connect(
            send, transport="acp-ws", principal=principal, bearer=bearer, remote=True
        )
        ws.headers[CONNECTION_HEADER] = conn.id
        await ws.prepare(request)
        self.websockets.add(ws)
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await conn.receive(msg.data)
                elif msg.type != aiohttp.WSMsgType.BINARY:  # binary frames are ignored (RFD)
                    exc = ws.exception()
                    if msg.type == aiohttp.WSMsgType.ERROR and (
                        getattr(exc, "code", None) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
                    ):  # aiohttp closed it with 1009
                        self._reject(request, "ws", rj.MESSAGE_TOO_LARGE, 1009)
                    break
        finally:
            self.websockets.discard(ws)
            await conn.close()
        return ws

    # --- Streamable HTTP ---------------------------------------------------------------

    def _connection(self, request: web.Request) -> RemoteConnection | web.Response:
        cid = request.headers.get(CONNECTION_HEADER, "").strip()
        if not cid:
            return _error(400, f"missing {CONNECTION_HEADER} header")
        remote = self.http.get(cid)
        # a connection answers only the principal that opened it: another token holding
        # its id would act, and read, as that principal (its sessions, its bearer)
        if remote is None or remote.conn is None or self._principal(request)[0] != remote.principal:
            return _error(404, f"unknown {CONNECTION_HEADER}")
        remote.touch()
        return remote

    async def _body(self, request: web.Request) -> bytes | web.Response:
        if not request.headers.get("Content-Type", "").lower().startswith("application/json"):
            return _error(415, "Content-Type must be application/json")
        try:
            async with asyncio.timeout(self._read_timeout):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            self._reject(request, "http", rj.BODY_TOO_LARGE, 413)
            return _error(413, f"request body too large: limit is {self._max_body} bytes")
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            self._reject(request, "http", rj.BAD_BODY, 400)
            return _error(400, "invalid body")

    async def post(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        item = codec.decode(body)
        if isinstance(item, codec.Invalid) and body.lstrip().startswith(b"["):
            return _error(501, "batch requests are not supported")
        if (
            isinstance(item, jsonrpc.Request)
            and item.method == "initialize"
            and not item.is_notification
            and not request.headers.get(CONNECTION_HEADER)
        ):
            return await self._initialize(request, item)
        remote = self._connection(request)
        if isinstance(remote, web.Response):
            return remote
        if (
            isinstance(item, jsonrpc.Request)
            and item.method in SESSION_SCOPED
            and not request.headers.get(SESSION_HEADER, "").strip()
        ):
            return _error(400, f"missing {SESSION_HEADER} header for {item.method}")
        assert remote.conn is not None
        await remote.conn.receive(body)
        if remote.broken:
            await self._drop(remote, "a stream's buffer is full: the client stopped reading")
        return web.Response(status=202)

    async def _initialize(self, request: web.Request, req: jsonrpc.Request) -> web.StreamResponse:
        full = self._full(request, "http")
        if full is not None:
            return full
        principal, bearer = self._principal(request)
        remote = RemoteConnection(self._buffer, principal=principal)

        async def send(message: dict[str, Any], scope: str | None) -> None:
            remote.route(message, scope)

        conn = self.front.connect(
            send, transport="acp-http", principal=principal, bearer=bearer, remote=True
        )
        remote.id, remote.conn = conn.id, conn
        reply = await conn.dispatcher.handle(req, conn_call(conn))
        encoded = (self.front.wire.encode(reply) if reply is not None else None) or b"null"
        if reply is None or "error" in reply:
            await conn.close()
            return web.Response(status=200, body=encoded + b"\n", content_type="application/json")
        self.http[conn.id] = remote
        return web.Response(
            status=200,
            body=encoded + b"\n",
            content_type="application/json",
            headers={CONNECTION_HEADER: conn.id},
        )

    async def _known_session(self, remote: RemoteConnection, session_id: str) -> bool:
        """A session this connection's principal may use: another client's answers as an
        unknown one does (a 200 would tell that the id exists)."""
        if session_id in remote.sessions:
            return True
        principal = remote.conn.principal if remote.conn is not None else remote.principal
        acp = self.front.sessions.get(session_id)
        if acp is not None and acp.owner and acp.owner != principal:
            return False
        sessions = self.front.bridge.sessions
        live = sessions.get(session_id)
        if live is not None:
            return sessions.may_use(live.owner, principal)
        if acp is not None:
            return True
        record = await self.front.bridge.store.load(session_id)
        if record is None:
            return False
        acp_owner = dict(record.upstream).get(OWNER_KEY, "")
        return sessions.may_use(record.owner or acp_owner, principal)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        if "text/event-stream" not in request.headers.get("Accept", "").lower():
            return _error(406, "Accept must include text/event-stream")
        remote = self._connection(request)
        if isinstance(remote, web.Response):
            return remote
        sid = request.headers.get(SESSION_HEADER, "").strip()
        if sid and not await self._known_session(remote, sid):
            return _error(404, f"unknown {SESSION_HEADER}")
        box = remote.session_box(sid) if sid else remote.main
        response = web.StreamResponse(status=200, headers=sse_headers(request.keep_alive))
        await response.prepare(request)
        self._streams.add(response)
        generation = box.attach()
        try:
            await self._pump(response, box, generation)
        except (ConnectionError, RuntimeError, TimeoutError) as exc:  # the client went away
            log.debug("ACP stream ended", extra={"error": repr(exc)})
        finally:
            box.detach(generation)
            remote.touch()
            self._streams.discard(response)
        return response

    async def _pump(self, response: web.StreamResponse, box: Outbox, generation: int) -> None:
        while True:
            item = await box.get(generation)
            if item == END:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await response.write_eof()
                return
            if isinstance(item, str):  # KEEPALIVE
                data = SSE_KEEPALIVE
            else:
                encoded = self.front.wire.encode(item)  # secrets redacted; never raises
                if encoded is None:
                    continue
                data = b"data: " + encoded + b"\n\n"
            await wait_for(response.write(data), self._send_timeout)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        remote = self._connection(request)
        if isinstance(remote, web.Response):
            return remote
        await self._drop(remote, "DELETE")
        return web.Response(status=202)

    async def _drop(self, remote: RemoteConnection, why: str) -> None:
        self.http.pop(remote.id, None)
        remote.close()
        if remote.conn is not None:
            log.info("ACP connection closed", extra={"connection": remote.id[:8], "reason": why})
            await remote.conn.close()

    # --- lifecycle ---------------------------------------------------------------

    async def reap(self) -> None:
        """Close Streamable HTTP connections with no stream and no request for the idle TTL."""
        while True:
            await asyncio.sleep(min(REAP_INTERVAL, self._idle_ttl / 2))
            now = time.monotonic()
            for remote in list(self.http.values()):
                if remote.broken:
                    await self._drop(
                        remote, "a stream's buffer is full: the client stopped reading"
                    )
                elif not remote.streaming and now - remote.last_activity >= self._idle_ttl:
                    await self._drop(remote, "idle")

    async def close(self) -> None:
        self._closing = True
        for remote in list(self.http.values()):
            await self._drop(remote, "shutdown")
        for ws in list(self.websockets):
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server shutting down")
        await self.front.close()


def conn_call(conn: AcpConnection) -> CallContext:
    return CallContext(None, conn.transport, conn.principal, conn.bearer, None)
