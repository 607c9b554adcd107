"""``GET /console``: the operator console's page, its static files and its WebSocket.

The page and its files are public and hold no data; everything comes over
``/console/ws``, which speaks the ordinary JSON-RPC contract (same dispatcher,
transport name ``console``) once the first message, ``console.auth
{token}``, has passed the same bearer check as every other route. The token
never travels in a URL. The WebSocket admits a browser ``Origin`` only when it is
the page's own (its host and port are the request's ``Host``; on a bridge without a
token, a ``Host`` a DNS-rebinding page cannot have: loopback, an IP literal, the listen
host or a name of ``allowed_hosts``) or one of ``console.allowed_origins``; the
bridge-wide ``allowed_origins`` (``http://localhost:*`` and the like: any local dev
server) do not apply, since whoever opens this socket answers agents' permission
requests. ``X-Forwarded-*`` headers are not trusted (a proxy that rewrites ``Host``
needs the console's origin in ``console.allowed_origins``). No ``Origin``: not a
browser, admitted. Every frame sent to the page has the config's secret values
redacted.

Headers: a strict ``Content-Security-Policy`` (no inline script or style, nothing
but this origin, Trusted Types: no HTML sink takes a string), ``X-Frame-Options: DENY``,
``nosniff``, no referrer.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from xwm_bridge import __version__, jsonrpc
from xwm_bridge.console import PAGE, Asset, load_assets
from xwm_bridge.core.context import CallContext
from xwm_bridge.inflight import admits, refusal
from xwm_bridge.observability import rejections as rj
from xwm_bridge.observability.rejections import TOO_MANY_INFLIGHT, reject
from xwm_bridge.tasks import Supervisor, wait_for
from xwm_bridge.transport.http_ws import frame_bytes
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.transport.security import (
    OriginPolicy,
    ServedHosts,
    origin_refused,
    peer_of,
    principal_of,
)

if TYPE_CHECKING:
    from xwm_bridge.transport.http import HttpTransport


CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; manifest-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'; "
    # the page puts nothing into the DOM as markup (textContent only): a string given to
    # innerHTML and the other HTML sinks throws (Chromium), so a change that did is caught
    "require-trusted-types-for 'script'; trusted-types 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
AUTH_METHOD = "console.auth"
AUTH_TIMEOUT = 10.0
#: WebSocket close codes (4000-4999: application)
CLOSE_UNAUTHORIZED = 4401
CLOSE_BAD_AUTH_FRAME = 4400
#: requests one console connection may have running (cancels pass, up to twice it)
MAX_INFLIGHT = 64
TRANSPORT = "console"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_origin(origin: str, host: str | None) -> bool:
    """Whether ``origin`` is that of a page served under this ``Host`` header value:
    scheme http or https, nothing after the authority, and the same host and port
    (the scheme's default port when one leaves it out)."""
    if not host:
        return False
    try:
        page = urlsplit(origin)
        scheme = page.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not page.hostname:
            return False
        if page.path not in ("", "/") or page.query or page.fragment or page.username:
            return False
        served = urlsplit(f"{scheme}://{host.strip()}")
        if served.path or served.query or served.fragment or served.username:
            return False
        default = _DEFAULT_PORTS[scheme]
        return page.hostname == served.hostname and (page.port or default) == (
            served.port or default
        )
    except ValueError:  # a malformed port or IPv6 literal
        return False


class ConsoleHandlers:
    def __init__(self, transport: HttpTransport) -> None:
        self._t = transport
        bridge = transport.bridge
        config = bridge.config
        self.enabled = config.console.enabled
        self._assets: dict[str, Asset] = load_assets() if self.enabled else {}
        #: origins other than the page's own (not the bridge-wide ``allowed_origins``)
        self._origins = OriginPolicy(config.console.allowed_origins)
        #: a bridge without a token: the Host names the page's own origin may have (a
        #: DNS-rebinding page is same-origin with the bridge under its own name); ``*``
        #: in ``allowed_hosts`` does not count here
        hosts = tuple(h for h in config.allowed_hosts if h.strip() != "*")
        self._own_hosts = ServedHosts(not transport.auth.required, transport.listen_host, hosts)

    def _file(self, request: web.Request, name: str) -> web.StreamResponse:
        asset = self._assets.get(name)
        if asset is None:
            return web.Response(status=404, text="404 page not found\n", content_type="text/plain")
        headers = {
            **SECURITY_HEADERS,
            "Content-Type": asset.content_type,
            "ETag": asset.etag,
            "Cache-Control": "no-cache",
        }
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=asset.body, headers=headers)

    async def page(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="405 method not allowed\n")
        if request.path == "/console/":
            raise web.HTTPFound("/console")
        return self._file(request, PAGE)

    async def static(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, text="405 method not allowed\n")
        name = request.match_info.get("name", "")
        if name == PAGE or "/" in name or name.startswith("."):
            return self._file(request, "")
        return self._file(request, name)

    def origin_allowed(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin", "").strip()
        if not origin:
            return True  # not a browser
        if self._origins.rules and self._origins.allows(origin):
            return True
        host = request.headers.get("Host")
        if not same_origin(origin, host):
            return False
        return not (self._own_hosts.active and self._own_hosts.refuses(host))

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        if not self.enabled:
            return web.Response(status=404, text="404 page not found\n")
        origin = request.headers.get("Origin", "").strip()
        if not self.origin_allowed(request):
            self._refused(request, rj.ORIGIN, status=403)
            body = jsonrpc.error(None, jsonrpc.ORIGIN_NOT_ALLOWED, origin_refused(origin))
            return web.Response(
                status=403, body=jsonrpc.dumps(body), content_type="application/json"
            )
        limits = self._t.limits
        ws = web.WebSocketResponse(
            max_msg_size=limits.max_ws_message_bytes,
            heartbeat=limits.ws_heartbeat or None,
            compress=False,
        )
        if not ws.can_prepare(request).ok:
            return web.Response(status=400, text="400 bad request: websocket upgrade required\n")
        await ws.prepare(request)
        self._t.websockets.register(ws)
        try:
            call = await self._authenticate(request, ws)
            if call is not None:
                await self._serve(request, ws, call)
        finally:
            self._t.websockets.unregister(ws)
        return ws

    def _refused(self, request: web.Request, reason: str, **fields: Any) -> None:
        """Count and log one refusal, with the fields of every ``request rejected`` line
        (``path``, ``remote``; ``status``, or ``ws_close`` for a socket closed)."""
        reject(
            self._t.metrics,
            TRANSPORT,
            reason,
            path=request.path,
            remote=request.remote or "",
            **fields,
        )

    def _too_big(self, request: web.Request, ws: web.WebSocketResponse, msg: Any) -> None:
        """A message over ``limits.max_ws_message_bytes`` (aiohttp closed it, 1009):
        counted; any other end of the socket is not a refusal."""
        if msg.type == aiohttp.WSMsgType.ERROR and (
            getattr(ws.exception(), "code", None) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        ):
            self._refused(request, rj.MESSAGE_TOO_LARGE, ws_close=1009)

    async def _authenticate(
        self, request: web.Request, ws: web.WebSocketResponse
    ) -> CallContext | None:
        """The first frame must be ``console.auth {token}``; anything else closes.

        One attempt per connection: a refused token closes it (4401) and nothing
        after it on the connection is read. Each refusal is counted
        (``xwm_rejected_requests_total{transport="console",reason}``) and logged with
        the peer, never the value sent."""
        try:
            msg = await wait_for(ws.receive(), AUTH_TIMEOUT)
        except TimeoutError:
            self._refused(
                request, rj.MISSING_TOKEN, ws_close=CLOSE_BAD_AUTH_FRAME, why="auth timeout"
            )
            await ws.close(code=CLOSE_BAD_AUTH_FRAME, message=b"authenticate first")
            return None
        if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            self._too_big(request, ws, msg)
            return None
        try:
            req = jsonrpc.decode_request(msg.data)
        except jsonrpc.DecodeError:
            req = None
        if req is None or req.method != AUTH_METHOD:
            self._refused(
                request, rj.MISSING_TOKEN, ws_close=CLOSE_BAD_AUTH_FRAME, why="not console.auth"
            )
            await ws.send_str(
                jsonrpc.dumps(
                    jsonrpc.error(None, jsonrpc.UNAUTHORIZED, f"send {AUTH_METHOD} first")
                ).decode()
            )
            await ws.close(code=CLOSE_BAD_AUTH_FRAME, message=b"authenticate first")
            return None
        token = req.params.get("token")
        token = token.strip() if isinstance(token, str) else ""
        auth = self._t.auth
        header = f"Bearer {token}" if token else ""
        if auth.required:
            why = auth.verify(header)  # constant time
        else:  # no token configured (loopback only): the page works without one
            why, header = "", header or "Bearer anonymous-console"
        if why:
            self._refused(request, why, ws_close=CLOSE_UNAUTHORIZED)  # the reason, not the value
            await ws.send_str(
                jsonrpc.dumps(
                    jsonrpc.error(req.id, jsonrpc.UNAUTHORIZED, "invalid bearer token")
                ).decode()
            )
            await ws.close(code=CLOSE_UNAUTHORIZED, message=b"invalid token")
            return None
        principal, bearer = principal_of(header)
        reply = {
            "authenticated": True,
            "tokenRequired": auth.required,
            "principal": principal,
            "version": __version__,
        }
        await ws.send_str(jsonrpc.dumps(jsonrpc.result(req.id, reply)).decode())
        return CallContext(None, TRANSPORT, principal, bearer, None, peer_of(request))

    async def _serve(
        self, request: web.Request, ws: web.WebSocketResponse, auth: CallContext
    ) -> None:
        metrics = self._t.metrics
        sent, received = metrics.sent.get(TRANSPORT), metrics.received.get(TRANSPORT)

        async def write(data: bytes) -> None:  # encoded by the wire encoder: redacted
            await ws.send_str(data.decode())
            sent.inc(len(data))

        sender = OrderedSender(
            write, timeout=self._t.limits.notification_send_timeout, wire=self._t.wire
        )
        live = LiveConnection(sender.send)
        call = CallContext(sender.send, TRANSPORT, auth.principal, auth.bearer, live, auth.peer)
        inflight = Supervisor()
        dispatcher = self._t.dispatcher

        async def serve_one(req: jsonrpc.Request) -> None:
            reply = await dispatcher.handle(req, call)
            if reply is not None:
                await sender.send(reply)

        try:
            async for msg in ws:
                if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    self._too_big(request, ws, msg)
                    break
                received.inc(frame_bytes(msg.data))
                try:
                    req = jsonrpc.decode_request(msg.data)
                except jsonrpc.DecodeError as exc:  # counted as on /acp
                    self._refused(request, rj.decode_reason(exc.code), error=exc.message[:200])
                    await sender.send(exc.envelope())
                    continue
                if not admits(len(inflight), req.method, MAX_INFLIGHT):  # a cancel passes
                    self._refused(request, TOO_MANY_INFLIGHT)
                    if not req.is_notification:
                        await sender.send(refusal(req.id, MAX_INFLIGHT))
                    continue
                inflight.spawn(serve_one(req), name=f"console-request:{req.method}")
        finally:
            live.closed = True
            await inflight.shutdown(0)
            with contextlib.suppress(Exception):
                await ws.close()
