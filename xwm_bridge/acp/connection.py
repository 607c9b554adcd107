"""One ACP client connection, whatever carries it (stdio, WebSocket, Streamable HTTP).

The transport hands every incoming frame to :meth:`AcpConnection.receive` and gives
the connection a ``send(message, scope)`` coroutine; ``scope`` is the session a
message belongs to (``None``: connection level), which only the Streamable HTTP
transport uses (it picks the SSE stream by it). Requests run concurrently, each
in a task owned by the connection (at most ``inflight.MAX_INFLIGHT_PER_CONNECTION``),
through a :class:`~xwm_bridge.app.dispatcher.Dispatcher` over the ACP method
table, so every ACP request gets the same audit line and metrics as the bridge's own.
Requests the bridge sends the client (permissions, files, terminals) get ids of
their own; the client's answers resolve them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xwm_bridge import coerce, inflight, jsonrpc
from xwm_bridge.acp import codec
from xwm_bridge.acp.prompts import PromptSupport
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.core.context import CallContext
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.observability.rejections import TOO_MANY_INFLIGHT, reject
from xwm_bridge.tasks import Supervisor

if TYPE_CHECKING:
    from xwm_bridge.acp.front import AcpFrontDoor
    from xwm_bridge.acp.sessions import AcpSession
    from xwm_bridge.acp.turns import TurnRelay

log = logging.getLogger("xwm_bridge.acp")

Send = Callable[[dict[str, Any], str | None], Awaitable[None]]
#: methods whose answer belongs to the session's stream (the Streamable HTTP RFD)
SESSION_SCOPED = frozenset(
    (
        "session/prompt",
        "session/cancel",
        "session/set_mode",
        "session/set_config_option",
        "session/close",
    )
)
CLIENT_GONE = "the ACP client disconnected"
#: ACP request cancellation: either side withdraws a request it sent, by id
CANCEL_REQUEST = "$/cancel_request"
#: session ids a connection remembers after they left memory (then: session/load)
MAX_FORGOTTEN = 4096
PROMPT = "session/prompt"


@dataclass(slots=True)
class PromptRequest:
    """One ``session/prompt`` request in flight, by its JSON-RPC id: the relay of its
    turn once it has one, and whether ``$/cancel_request`` named it before that."""

    relay: TurnRelay | None = None
    cancelled: bool = False


@dataclass(slots=True)
class Reopen:
    """A session being read back from the store for one request; other requests naming
    it wait for ``done``. ``cancelled``: a ``session/cancel`` came meanwhile."""

    cancelled: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


#: the ``session/prompt`` request the current task serves (set by ``_serve``)
CURRENT_PROMPT: ContextVar[PromptRequest | None] = ContextVar("acp_prompt", default=None)


def request_key(rid: Any) -> tuple[str, Any] | None:
    """A request id as a dict key (``1``, ``"1"`` and ``true`` are different ids);
    None for one nobody can name (``null``, or not an id at all)."""
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        return (type(rid).__name__, rid)
    return None


class AcpConnection:
    def __init__(
        self,
        front: AcpFrontDoor,
        send: Send,
        *,
        transport: str,
        principal: str = "",
        bearer: str = "",
        remote: bool = False,
    ) -> None:
        from xwm_bridge.acp.methods import AcpMethods

        self.id = uuid.uuid4().hex
        self.front = front
        self._send = send
        self.transport = transport
        self.principal = principal or transport
        self.bearer = bearer
        self.remote = remote
        self.closed = False
        self.initialized = False
        self.client_capabilities: dict[str, Any] = {}
        self.client_info: dict[str, Any] = {}
        #: the ``promptCapabilities`` this client was given (``initialize``): what its
        #: prompts may hold; ``None`` before it asked (then the front door's current ones)
        self.prompt_support: PromptSupport | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._inflight = Supervisor()
        #: idle sessions of this connection that left memory (AcpSessions' bound): a
        #: request naming one reopens it from the store (at most MAX_FORGOTTEN kept)
        self._forgotten: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        #: sessions being reopened from the store for a request (``AcpMethods._open``)
        self._reopening: dict[str, Reopen] = {}
        #: this connection's ``session/prompt`` requests in flight, by id
        self.prompts: dict[tuple[str, Any], PromptRequest] = {}
        self.dispatcher = Dispatcher(AcpMethods(front, self).table(), front.bridge.metrics)

    def __repr__(self) -> str:
        return f"<AcpConnection {self.transport} {self.id[:8]}>"

    # --- incoming ---------------------------------------------------------------

    async def receive(self, data: bytes | str) -> None:
        await self.take(codec.decode(data))

    async def take(self, item: codec.Incoming) -> None:
        """Serve one classified frame (:func:`codec.decode`, :func:`codec.too_large`)."""
        if isinstance(item, codec.Invalid):
            if item.reply is not None:
                await self.send(item.reply, None)
            elif item.dropped:
                log.info("ACP notification dropped", extra={"reason": item.dropped})
        elif isinstance(item, codec.Response):
            self._resolve(item)
        else:
            await self.dispatch(item)

    async def dispatch(self, req: jsonrpc.Request) -> None:
        if self.closed:
            return
        if not inflight.admits(len(self._inflight), req.method):
            reject(self.front.bridge.metrics, self.transport, TOO_MANY_INFLIGHT)
            if not req.is_notification:
                await self.send(inflight.refusal(req.id), None)
            return
        prompt = None
        key = request_key(req.id) if req.method == PROMPT and not req.is_notification else None
        if key is not None:  # known before its task runs: a $/cancel_request right behind
            prompt = self.prompts[key] = PromptRequest()
        self._inflight.spawn(self._serve(req, key, prompt), name=f"acp-request:{req.method}")

    async def _serve(
        self, req: jsonrpc.Request, key: tuple[str, Any] | None, prompt: PromptRequest | None
    ) -> None:
        CURRENT_PROMPT.set(prompt)  # this task's own context
        scope = self.scope_of(req.method, req.params)
        try:
            call = CallContext(None, self.transport, self.principal, self.bearer, None)
            reply = await self.dispatcher.handle(req, call)
        finally:
            if key is not None and self.prompts.get(key) is prompt:
                del self.prompts[key]
        if reply is not None:
            await self.send(reply, scope)

    @staticmethod
    def scope_of(method: str, params: dict[str, Any]) -> str | None:
        if method in SESSION_SCOPED:
            return coerce.text(params.get("sessionId")) or None
        return None

    def _resolve(self, response: codec.Response) -> None:
        fut = self._pending.pop(response.id, None) if isinstance(response.id, int) else None
        if fut is None or fut.done():
            log.debug("unmatched response from the ACP client", extra={"id": str(response.id)[:40]})
            return
        if response.error is not None:
            code = response.error.get("code")
            fut.set_exception(
                RpcError(
                    code if isinstance(code, int) else jsonrpc.INTERNAL_ERROR,
                    coerce.text(response.error.get("message"), "client error"),
                )
            )
        else:
            fut.set_result(response.result)

    # --- outgoing ---------------------------------------------------------------

    async def send(self, message: dict[str, Any], scope: str | None) -> None:
        if not self.closed:
            await self._send(message, scope)

    async def start_request(
        self, method: str, params: dict[str, Any], scope: str | None
    ) -> asyncio.Future[Any]:
        """Send a request to the client; the future gets its result (or ``RpcError``).
        The caller bounds the wait and calls :meth:`forget` if it stops waiting."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_exception(RpcError(jsonrpc.INTERNAL_ERROR, CLIENT_GONE))
            return fut
        rid = next(self._ids)
        self._pending[rid] = fut
        fut.add_done_callback(lambda _: self._pending.pop(rid, None))
        try:
            await self.send(jsonrpc.request(rid, method, params), scope)
        except BaseException:  # not sent: nobody will wait for it
            self._pending.pop(rid, None)
            fut.cancel()
            raise
        return fut

    def forget(self, fut: asyncio.Future[Any]) -> None:
        if not fut.done():
            fut.cancel()

    async def withdraw(self, fut: asyncio.Future[Any], scope: str | None) -> None:
        """The bridge no longer wants the answer to a request it sent (it settled the
        question itself): :meth:`forget` it, and, with ``acp.cancel_requests``, tell the
        client with ``$/cancel_request {requestId}`` (ACP request cancellation) so its
        dialog can close. The client's answer, if it still comes (ACP: a result or
        ``-32800``), matches no request and is dropped (a debug line)."""
        rid = next((r for r, f in self._pending.items() if f is fut and not f.done()), None)
        self.forget(fut)
        if rid is not None and self.front.config.acp.cancel_requests and not self.closed:
            await self.send(jsonrpc.notification(CANCEL_REQUEST, {"requestId": rid}), scope)

    def serves(self, method: str) -> bool:
        """Did the client declare the capability behind an agent→client ``method``?"""
        caps = self.client_capabilities
        fs = caps.get("fs") if isinstance(caps.get("fs"), dict) else {}
        assert isinstance(fs, dict)
        if method == "fs/read_text_file":
            return fs.get("readTextFile") is True
        if method == "fs/write_text_file":
            return fs.get("writeTextFile") is True
        if method.startswith("terminal/"):
            return caps.get("terminal") is True
        return False

    # --- sessions that left memory ---------------------------------------------

    def forget_session(self, session: AcpSession) -> None:
        sid = session.session_id
        self._forgotten[sid] = session.mcp_servers  # not in the store: kept here
        self._forgotten.move_to_end(sid)
        while len(self._forgotten) > MAX_FORGOTTEN:
            self._forgotten.popitem(last=False)

    def take_forgotten(self, session_id: str) -> list[dict[str, Any]] | None:
        """The MCP servers of ``session_id`` if it was open here before it left memory,
        else None (asked once)."""
        return self._forgotten.pop(session_id, None)

    # --- sessions being reopened --------------------------------------------------

    def begin_reopen(self, session_id: str) -> None:
        self._reopening[session_id] = Reopen()

    def reopening(self, session_id: str) -> Reopen | None:
        """The reopen under way of ``session_id`` (another request waits for it)."""
        return self._reopening.get(session_id)

    def cancel_reopen(self, session_id: str) -> bool:
        """``session/cancel`` of a session being reopened: kept for the prompts that
        reopen it or wait for it (True), else False."""
        reopen = self._reopening.get(session_id)
        if reopen is not None:
            reopen.cancelled = True
        return reopen is not None

    def end_reopen(self, session_id: str) -> bool:
        """The reopen is over (the requests waiting for it go on): whether a
        ``session/cancel`` came meanwhile."""
        reopen = self._reopening.pop(session_id, None)
        if reopen is None:
            return False
        reopen.done.set()
        return reopen.cancelled

    # --- lifecycle ---------------------------------------------------------------

    async def close(self) -> None:
        """The client is gone: its requests end, its sessions detach (their turns go on)."""
        if self.closed:
            return
        self.closed = True
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(RpcError(jsonrpc.INTERNAL_ERROR, CLIENT_GONE))
        self._pending.clear()
        self._forgotten.clear()
        self.front.detach(self)
        await self._inflight.shutdown(0)

    async def wait_idle(self) -> None:
        """Wait for the requests in flight (stdio at end of input)."""
        await self._inflight.wait(None)
