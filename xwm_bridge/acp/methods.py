"""The ACP method table of one connection (ACP protocol version 1).

``initialize``, ``authenticate``, ``session/new``, ``session/load``,
``session/resume``, ``session/list``, ``session/close``, ``session/prompt``,
``session/cancel``, ``session/set_mode``, ``session/set_config_option``. Every
handler has the bridge's handler signature, so the
:class:`~xwm_bridge.app.dispatcher.Dispatcher` gives ACP requests the same audit
line and metrics as the bridge's own; unknown methods are ``-32601``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from xwm_bridge import __version__, coerce, jsonrpc
from xwm_bridge.acp import codec, prompts, updates
from xwm_bridge.acp import params as checks
from xwm_bridge.acp.connection import CANCEL_REQUEST, CURRENT_PROMPT, request_key
from xwm_bridge.acp.options import Choice
from xwm_bridge.acp.sessions import AcpSession, new_session_id, session_info
from xwm_bridge.acp.turns import TurnRelay
from xwm_bridge.core.context import CallContext, Handler
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.store.base import NOTIFICATION
from xwm_bridge.store.records import SessionQuery

if TYPE_CHECKING:
    from xwm_bridge.acp.connection import AcpConnection
    from xwm_bridge.acp.front import AcpFrontDoor

log = logging.getLogger("xwm_bridge.acp")
AGENT_INFO = {"name": "xwm-bridge", "title": "xworkmate bridge", "version": __version__}
BEARER_METHOD = {
    "id": "bearer",
    "name": "Bridge token",
    "description": "Send 'Authorization: Bearer <the bridge token>' on every HTTP request and on "
    "the WebSocket upgrade; the transport checks it before any message is read.",
}


class AcpMethods:
    def __init__(self, front: AcpFrontDoor, conn: AcpConnection) -> None:
        self.front = front
        self.conn = conn

    def table(self) -> dict[str, Handler]:
        return {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.session_new,
            "session/load": self.session_load,
            "session/resume": self.session_resume,
            "session/list": self.session_list,
            "session/close": self.session_close,
            "session/prompt": self.session_prompt,
            "session/cancel": self.session_cancel,
            "session/set_mode": self.session_set_mode,
            "session/set_config_option": self.session_set_config_option,
            CANCEL_REQUEST: self.cancel_request,
        }

    # --- connection ---------------------------------------------------------------

    def _auth_methods(self) -> list[dict[str, Any]]:
        cfg = self.front.config
        return (
            [dict(BEARER_METHOD)]
            if self.conn.remote and (cfg.auth_token or cfg.client_tokens)
            else []
        )

    async def initialize(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        checks.protocol_version(params)  # any version asked: the answer is the one spoken here
        caps = params.get("clientCapabilities")
        info = params.get("clientInfo")
        self.conn.client_capabilities = caps if isinstance(caps, dict) else {}
        self.conn.client_info = info if isinstance(info, dict) else {}
        self.conn.initialized = True
        support = self.conn.prompt_support = self.front.prompt_support()
        return {
            "protocolVersion": codec.PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": support.wire(),
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
            },
            "authMethods": self._auth_methods(),
            "agentInfo": dict(AGENT_INFO),
        }

    async def authenticate(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        method_id = checks.text_param(params, "methodId")
        if method_id not in {m["id"] for m in self._auth_methods()}:
            raise RpcError(INVALID_PARAMS, f"unknown authentication method {method_id!r}")
        return {}  # the transport already checked the bearer token of this connection

    # --- session setup ---------------------------------------------------------------

    async def session_new(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        cwd = checks.absolute_cwd(params)
        servers = checks.mcp_servers(params)
        choice = self.front.catalog.from_meta(params.get("_meta"))
        session = AcpSession(
            new_session_id(), cwd, choice, owner=self.conn.principal, mcp_servers=servers
        )
        self.front.sessions.add(session)
        await self.front.persist(session)
        self.front.attach(session, self.conn)
        return {"sessionId": session.session_id, **self.front.catalog.state(choice)}

    async def session_load(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session, history = await self._reopen(params)
        sid = session.session_id

        async def send(message: dict[str, Any]) -> None:
            await self.conn.send(message, sid)

        # another load's replay (or a resume) of this session first: it would take the
        # session and its buffer from under this one (live updates lost or out of order)
        async with session.attaching:
            session.buffer = []  # live updates of a running turn wait for the replay
            self.front.attach(session, self.conn)
            try:
                ledger = await self.front.ledger(sid)
                last = ledger[-1].event_id if ledger else -1
                notes = [e.message for e in ledger if e.kind == NOTIFICATION]
                for update in updates.replay_updates(history, notes):
                    body = {"sessionId": sid, "update": update}
                    await send(jsonrpc.notification("session/update", body))
                await session.end_replay(last, send)
            except BaseException:
                session.buffer = None
                raise
        return self.front.catalog.state(session.choice)

    async def session_resume(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session, _ = await self._reopen(params)
        async with session.attaching:  # after a load's replay under way: it hands over
            self.front.attach(session, self.conn)
        return self.front.catalog.state(session.choice)

    async def _reopen(self, params: dict[str, Any]) -> tuple[AcpSession, tuple[str, ...]]:
        sid = checks.text_param(params, "sessionId")
        cwd = checks.absolute_cwd(params)
        servers = checks.mcp_servers(params)
        session, history = await self.front.find(sid, cwd, self.conn.principal)
        if session is None:
            raise RpcError(codec.RESOURCE_NOT_FOUND, f"unknown session {sid!r}")
        session.mcp_servers = servers  # load and resume carry them again (ACP)
        if session.cwd != cwd:
            session.cwd = cwd
        await self.front.persist(session)
        return session, history

    async def session_list(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        cwd = checks.list_cwd(params)
        query = SessionQuery(
            limit=self.front.config.acp.list_page_size,
            upstream=(("acp.cwd", cwd), ("acp.owner", self.conn.principal)),
            after=checks.decode_cursor(params.get("cursor")),
        )
        page = await self.front.bridge.store.list_sessions(query)
        out: dict[str, Any] = {"sessions": [session_info(r) for r, _ in page.items]}
        if page.next_after is not None:
            out["nextCursor"] = checks.encode_cursor(*page.next_after)
        return out

    async def session_close(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        sid = checks.text_param(params, "sessionId")
        session = self._mine(sid)
        pending = self.conn.reopening(sid) if session is None else None
        if pending is not None:  # a prompt reopens it: that prompt is cancelled, then close
            self.conn.cancel_reopen(sid)
            await pending.done.wait()
            session = self._mine(sid)
        if session is None and self.conn.take_forgotten(sid) is not None:
            return {}  # open here, idle, and out of memory: nothing runs to cancel
        if session is None:
            raise RpcError(codec.RESOURCE_NOT_FOUND, f"session {sid!r} is not active")
        await self.front.cancel(session, self.conn.principal)
        self.front.close_session(session)
        return {}

    def _mine(self, sid: str) -> AcpSession | None:
        """A live session of this connection's principal (another's is unknown here, as
        for ``session/load``)."""
        session = self.front.sessions.get(sid)
        if session is None or (session.owner and session.owner != self.conn.principal):
            return None
        return session

    # --- turns ---------------------------------------------------------------

    async def _open(self, params: dict[str, Any]) -> AcpSession:
        session, _ = await self._reopened(params)
        return session

    async def _reopened(self, params: dict[str, Any]) -> tuple[AcpSession, bool]:
        """The session a request names, open on this connection (reopened from the store
        if it left memory), and whether a ``session/cancel`` came during the reopen."""
        sid = checks.text_param(params, "sessionId")
        session = self.front.sessions.get(sid)
        cancelled = False
        pending = self.conn.reopening(sid) if session is None else None
        if pending is not None:  # another request of this connection reopens it
            await pending.done.wait()
            session, cancelled = self.front.sessions.get(sid), pending.cancelled
        servers = None if session is not None else self.conn.take_forgotten(sid)
        if servers is not None:  # open here, and left memory while idle
            self.conn.begin_reopen(sid)
            try:
                session, _ = await self.front.find(sid, "", self.conn.principal)
            finally:
                cancelled = self.conn.end_reopen(sid)
            if session is not None:
                session.mcp_servers = servers
                self.front.attach(session, self.conn)
        if session is None or session.client is not self.conn:
            raise RpcError(  # as session/load of an unknown session: ACP's resource not found
                codec.RESOURCE_NOT_FOUND,
                f"session {sid!r} is not open on this connection: "
                "create it with session/new, or reattach with session/load or session/resume",
            )
        return session, cancelled

    async def session_prompt(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session, cancelled = await self._reopened(params)
        support = self.conn.prompt_support or self.front.prompt_support()
        blocks = prompts.check_prompt(params.get("prompt"), support)
        relay = TurnRelay(self.front, session, blocks)
        # in session.turns before the first await: a session/cancel right behind the
        # prompt (while the title is stored or a gateway connected) finds it
        session.turns.add(relay)
        request = CURRENT_PROMPT.get()
        if request is not None:  # $/cancel_request names it from now on
            request.relay = relay
            cancelled = cancelled or request.cancelled
        if cancelled:  # while it was reopened, or by $/cancel_request: at its start
            relay.cancel()
        try:
            if not session.title:
                session.title = prompts.title_of(prompts.prompt_text(blocks))
                await self.front.persist(session)
            await self.front.prepare_route(session.choice, self.conn)
            turn = prompts.turn_params(
                session.session_id, session.cwd, blocks, session.choice.route, session.choice.model
            )
            if session.mcp_servers and self.front.takes_client_mcp(session.choice.route):
                turn["mcpServers"] = session.mcp_servers
        except Exception as exc:
            session.turns.discard(relay)
            return relay.respond_error(exc)
        except BaseException:
            session.turns.discard(relay)
            raise
        ctx = CallContext(
            relay,
            self.conn.transport,
            self.conn.principal,
            self.conn.bearer,
            client=relay,
            withdrawn=relay.cancelled,  # a cancel takes a queued prompt off its queue
        )
        # the turn outlives this request: a dropped connection cancels the request, and
        # the relay (its updates, its permission requests) stays with the session for a
        # client that reattaches, until the turn ends
        task = self.front.tasks.spawn(
            self._run_turn(turn, ctx), name=f"acp-turn:{session.session_id}"
        )

        def ended(_: asyncio.Task[Any]) -> None:  # run even if the task never started
            session.turns.discard(relay)
            relay.finish()

        task.add_done_callback(ended)
        result, error = await asyncio.shield(task)
        if error is not None:
            return relay.respond_error(error)
        return await relay.respond(result)

    async def _run_turn(
        self, turn: dict[str, Any], ctx: CallContext
    ) -> tuple[dict[str, Any], Exception | None]:
        try:
            return await self.front.methods.session_turn(turn, ctx, "session.message"), None
        except Exception as exc:  # the request's to raise, if it is still there
            return {}, exc

    async def session_cancel(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        sid = coerce.text(params.get("sessionId"))
        if sid and self.conn.cancel_reopen(sid):
            return {}  # its prompt is being reopened from the store: applied there
        session = self._mine(sid) if sid else None
        if session is not None:
            await self.front.cancel(session, self.conn.principal)
        return {}

    async def cancel_request(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """``$/cancel_request {requestId}`` (optional in ACP): a ``session/prompt`` of this
        connection in flight is cancelled as by ``session/cancel``, it alone; else ignored."""
        key = request_key(params.get("requestId"))
        request = self.conn.prompts.get(key) if key is not None else None
        if request is None:
            log.debug("$/cancel_request of no prompt in flight; ignored")
            return {}
        request.cancelled = True  # not registered yet: the prompt takes it
        if request.relay is not None:
            await self.front.cancel_prompt(request.relay, self.conn.principal)
        return {}

    async def session_set_mode(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session = await self._open(params)
        await self._set(session, "route", checks.text_param(params, "modeId"))
        return {}

    async def session_set_config_option(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session = await self._open(params)
        config_id = checks.text_param(params, "configId")
        await self._set(session, config_id, params.get("value"))
        return {"configOptions": self.front.catalog.config_options(session.choice)}

    async def _set(self, session: AcpSession, config_id: str, value: Any) -> None:
        old = session.choice
        new: Choice = self.front.catalog.set(old, config_id, value)
        if new == old:
            return
        session.choice = new
        await self.front.persist(session)
        sid = session.session_id
        if new.route != old.route:
            update: dict[str, Any] = {
                "sessionUpdate": "current_mode_update",
                "currentModeId": new.route,
            }
            await session.deliver(
                jsonrpc.notification("session/update", {"sessionId": sid, "update": update})
            )
        options = {
            "sessionUpdate": "config_option_update",
            "configOptions": self.front.catalog.config_options(new),
        }
        await session.deliver(
            jsonrpc.notification("session/update", {"sessionId": sid, "update": options})
        )
