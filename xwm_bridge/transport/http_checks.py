"""What the HTTP transport checks of a request before its method runs (contract.md §4).

:class:`HttpChecks` is the base of ``HttpTransport`` (``http.py``): the ``Host``
check of a bridge without a token (421, before any route: :meth:`HttpChecks.served`,
an aiohttp middleware, and :meth:`HttpChecks.denied` for the front), the origin and
bearer checks, the CORS headers of an answer, the refusals (origin 403, bearer
401, body 413/400, parser 400/431), each counted and logged (``rejections.py``),
and the :class:`CallContext` an admitted request calls as. The front
(``front.py``) calls the same methods for the ``/acp/rpc`` connections it answers;
the route modules (``http_sse.py``, ``http_ws.py``) get them as bound methods.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.codings import transfer_refusal
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import CallContext
from xwm_bridge.netaddr import parse_listen
from xwm_bridge.observability import rejections as rj
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.transport.exchange import CORS_HEADERS, JSON_HEADERS, VARY, Reply, RequestView
from xwm_bridge.transport.security import (
    AUTH_MESSAGES,
    ORIGIN_SHOWN,
    BearerAuth,
    OriginPolicy,
    PrincipalCache,
    ServedHosts,
    origin_refused,
    peer_of,
)

#: :meth:`HttpChecks._guard`: the refusal of a request (origin, bearer), or None
Guard = Callable[[web.Request, str], web.Response | None]


class Reject(Protocol):
    """:meth:`HttpChecks._reject`: count and log one refused request."""

    def __call__(
        self, request: RequestView, transport: str, reason: str, status: int, **fields: Any
    ) -> None: ...


class CallFactory(Protocol):
    """:meth:`HttpChecks._call`: the :class:`CallContext` of an admitted request."""

    def __call__(
        self,
        request: RequestView,
        notify: Any,
        transport: str,
        connection: Any = None,
        *,
        notify_many: Any = None,
    ) -> CallContext: ...


#: the answer to a request naming a ``Host`` a bridge without a token does not serve
MISDIRECTED = Reply(
    421,
    b"421 misdirected request: this bridge does not answer that Host name (allowed_hosts)\n",
    {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"},
)


#: the text of :meth:`HttpChecks.bad_request` by status
_PLAIN = {
    400: "400 bad request",
    431: "431 request header fields too large",
    501: "501 not implemented: the only transfer coding taken is chunked",
}


def _listen_host(listen: str) -> str:
    try:
        return parse_listen(listen)[0]
    except ValueError:
        return ""


def rpc_error_response(status: int, code: int, message: str) -> web.Response:
    return web_reply(rpc_error(status, code, message))


def rpc_error(status: int, code: int, message: str) -> Reply:
    return Reply(status, jsonrpc.dumps(jsonrpc.error(None, code, message)) + b"\n", JSON_HEADERS)


def web_reply(reply: Reply) -> web.Response:
    if not reply.body and not reply.headers:
        return web.Response(status=reply.status)
    return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


def apply_cors(response: web.StreamResponse, cors: dict[str, str]) -> None:
    if not cors:
        return
    response.headers.update(cors)
    for value in VARY:
        response.headers.add("Vary", value)


class HttpChecks:
    def __init__(self, config: BridgeConfig, metrics: Metrics) -> None:
        self.origins = OriginPolicy(config.allowed_origins)
        self.auth = BearerAuth(config.auth_token, (*config.client_tokens, *config.admin_tokens))
        self.principals = PrincipalCache()
        #: DNS rebinding: only a bridge that accepts any bearer checks the Host
        self.listen_host = _listen_host(config.listen)
        self.hosts = ServedHosts(not self.auth.required, self.listen_host, config.allowed_hosts)
        self.limits = config.limits
        self.metrics = metrics

    def _cors(self, request: RequestView) -> dict[str, str]:
        origin = request.headers.get("Origin", "").strip()
        if origin and self.origins.allows(origin):
            if self.hosts.active and self.hosts.refuses(request.headers.get("Host")):
                return {}  # its 421 is readable by no page (as the middleware's, on aiohttp)
            return {"Access-Control-Allow-Origin": origin, **CORS_HEADERS}
        return {}

    def cors(self, request: RequestView) -> dict[str, str]:
        """The CORS headers of an answer to ``request`` (none without an ``Origin``)."""
        return self._cors(request) if "Origin" in request.headers else {}

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

    def misdirected(self, request: RequestView, transport: str) -> Reply:
        host = request.headers.get("Host", "")
        self._reject(request, transport, rj.HOST_NOT_ALLOWED, 421, host=host[:200])
        return MISDIRECTED

    @web.middleware
    async def served(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Every route of a bridge without a token: a foreign ``Host`` gets 421."""
        if self.hosts.refuses(request.headers.get("Host")):
            upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
            return web_reply(self.misdirected(request, "ws" if upgrade else "http"))
        return await handler(request)

    def unframed(self, request: web.Request) -> web.Response | None:
        """A ``Transfer-Encoding`` aiohttp parsed but the bridge does not implement
        (``codings.py``: 501, or 400; any in HTTP/1.0 is 400, RFC 9112 §6.1), answered
        before the body is read, with ``Connection: close``; else None. The front
        decides its own requests the same way."""
        if "Transfer-Encoding" not in request.headers:
            return None
        coding = ",".join(request.headers.getall("Transfer-Encoding"))
        status = 400 if request.version < (1, 1) else transfer_refusal(coding)
        if not status:
            return None
        response = web_reply(self.bad_request(request, rj.CODING, status))
        response.force_close()
        return response

    @web.middleware
    async def framed(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        """Every route: :meth:`unframed` first."""
        return self.unframed(request) or await handler(request)

    def denied(self, request: RequestView, transport: str = "http") -> Reply | None:
        """Host (a bridge without a token), origin, then bearer checks (contract.md §4
        steps 4-5): the refusal, or None."""
        headers = request.headers
        if self.hosts.active and self.hosts.refuses(headers.get("Host")):
            return self.misdirected(request, transport)
        origin = headers.get("Origin")
        if origin and not self.origins.allows(origin.strip()):
            origin = origin.strip()
            self._reject(request, transport, rj.ORIGIN, 403, origin=origin[:ORIGIN_SHOWN])
            return rpc_error(403, jsonrpc.ORIGIN_NOT_ALLOWED, origin_refused(origin))
        why = self.auth.verify(headers.get("Authorization"))
        if why:
            self._reject(request, transport, why, 401)
            return rpc_error(401, jsonrpc.UNAUTHORIZED, AUTH_MESSAGES[why])
        return None

    def _guard(self, request: web.Request, transport: str = "http") -> web.Response | None:
        denied = self.denied(request, transport)
        return None if denied is None else web_reply(denied)

    def body_too_large(self, request: RequestView) -> Reply:
        self._reject(request, "http", rj.BODY_TOO_LARGE, 413)
        return rpc_error(
            413,
            jsonrpc.INVALID_REQUEST,
            f"request body too large: limit is {self.limits.max_body_bytes} bytes",
        )

    def bad_request(self, request: RequestView, reason: str, status: int) -> Reply:
        """A request the front's HTTP parser refused (``rj.BAD_REQUEST``, 400), whose
        head is too large (``rj.HEAD_TOO_LARGE``, 431) or whose transfer codings the
        bridge does not take (``rj.CODING``, 501 or 400)."""
        self._reject(request, "http", reason, status)
        text = _PLAIN.get(status) or _PLAIN[400]
        return Reply(status, text.encode() + b"\n", {"Content-Type": "text/plain"})

    def bad_body(self, request: RequestView) -> Reply:
        self._reject(request, "http", rj.BAD_BODY, 400)
        return rpc_error(400, jsonrpc.INVALID_REQUEST, "invalid body")

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
