"""The ACP front door of one bridge: routes, sessions and connections over the bridge core.

One per process, shared by every ACP transport (``xwm-bridge acp`` has one
connection; ``serve``'s ``/acp/remote`` many). Turns go through the same
:class:`~xwm_bridge.app.methods.BridgeMethods` as ``serve``: no second pipeline.
"""

from __future__ import annotations

import logging
from typing import Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.acp.connection import AcpConnection, Send
from xwm_bridge.acp.options import Choice, RouteCatalog
from xwm_bridge.acp.prompts import PromptSupport
from xwm_bridge.acp.sessions import AcpSession, AcpSessions, Client, from_upstream
from xwm_bridge.acp.turns import TurnRelay
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.methods import BridgeMethods
from xwm_bridge.core.context import CallContext
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.store.base import LedgerEntry
from xwm_bridge.tasks import Supervisor
from xwm_bridge.wire import WireEncoder

log = logging.getLogger("xwm_bridge.acp")

#: the runtime the front door connects for ``gateway:openclaw`` routes (per principal)
OPENCLAW_RUNTIME = "acp-openclaw"


class AcpFrontDoor:
    def __init__(self, bridge: Bridge, methods: BridgeMethods | None = None) -> None:
        self.bridge = bridge
        self.methods = methods if methods is not None else BridgeMethods(bridge)
        self.config = bridge.config
        self.catalog = RouteCatalog(bridge.config)
        self.sessions = AcpSessions()
        #: running turns (they outlive the request that started them) and permission
        #: relays (each bounded by ``agents.permission_timeout``)
        self.tasks = Supervisor()
        #: every message to an ACP client is encoded here: secrets redacted, never raises
        self.wire = WireEncoder(bridge.config.credentials())

    def prompt_support(self) -> PromptSupport:
        """The ``promptCapabilities`` to advertise now. ``image`` only once a configured
        stdio agent said in its own ``initialize`` answer that it takes images (the agent
        catalog: learnt when the agent first runs, kept across restarts in the state dir):
        only such an agent gets an image as sent. A stdio agent that takes none, an HTTP
        upstream, multi-agent and the gateways get a text marker instead, so a bridge
        with no such agent (or none run yet) does not offer images."""
        catalog = self.bridge.stdio_agents.catalog
        image = any(
            p.is_stdio and catalog.takes(p.id, "image") for p in self.config.available_providers
        )
        return PromptSupport(image=image)

    def connect(
        self,
        send: Send,
        *,
        transport: str,
        principal: str = "",
        bearer: str = "",
        remote: bool = False,
    ) -> AcpConnection:
        return AcpConnection(
            self, send, transport=transport, principal=principal, bearer=bearer, remote=remote
        )

    async def close(self) -> None:
        await self.tasks.shutdown(0)

    # --- attachment ---------------------------------------------------------------

    def attach(self, session: AcpSession, client: Client) -> None:
        session.client = client
        self.sessions.add(session)
        for relay in session.turns:  # open permission requests ask the new client
            relay.attached()

    def detach(self, client: Client) -> None:
        for session in self.sessions.attached_to(client):
            session.client = None
            session.buffer = None

    @staticmethod
    def connection_of(session: AcpSession) -> AcpConnection | None:
        client = session.client
        return client if isinstance(client, AcpConnection) and not client.closed else None

    # --- persistence ---------------------------------------------------------------

    async def persist(self, session: AcpSession) -> None:
        """Keep the ACP fields in the bridge session's record (``acp.*`` upstream keys)."""
        sid = session.session_id
        live = await self.bridge.sessions.load(sid, sid)
        live.upstream.update(session.upstream_keys())
        if not live.owner:  # its principal's from session/new on, not from its first turn:
            # an unowned session is anyone's (listed, read, and taken by another's turn)
            live.owner = session.owner
        self.bridge.sessions.persist(live)

    async def find(
        self, session_id: str, cwd: str, principal: str
    ) -> tuple[AcpSession | None, tuple[str, ...]]:
        """A session by id: live, else from the store (after a restart); and its prompts.
        Another principal's session is not found."""
        live = self.bridge.sessions.get(session_id)
        record = None if live is not None else await self.bridge.store.load(session_id)
        if live is None and record is None:
            known = self.sessions.get(session_id)
            if known is not None and known.owner and known.owner != principal:
                return None, ()
            return known, ()
        owner = live.owner if live is not None else (record.owner if record else "")
        if not self.bridge.sessions.may_use(owner, principal):
            return None, ()  # another's bridge session (/acp/rpc): no acp.owner key
        upstream = live.upstream if live is not None else dict(record.upstream if record else ())
        history = tuple(live.history) if live is not None else (record.history if record else ())
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions.add(
                from_upstream(session_id, upstream, Choice(self.catalog.default), cwd)
            )
        if session.owner and session.owner != principal:
            return None, ()
        try:  # a route removed from the config since: back to the default
            session.choice = self.catalog.check(session.choice)
        except RpcError:
            session.choice = Choice(self.catalog.default)
        return session, history

    async def ledger(self, sid: str) -> list[LedgerEntry]:
        """The session's whole ledger, oldest first: one ``store.replay`` call returns at
        most ``store.replay_max_items`` entries (the oldest), so read page after page
        (the store bounds the ledger itself)."""
        store = self.bridge.store
        size = self.config.store.replay_max_items
        ledger = page = await store.replay(sid, 0, size)
        while len(page) >= size:
            page = await store.replay(sid, 0, size, after_event=ledger[-1].event_id)
            if not page or page[0].event_id <= ledger[-1].event_id:
                break  # no progress: never loop on a store that repeats itself
            ledger = ledger + page
        return ledger

    def close_session(self, session: AcpSession) -> None:
        session.client = None
        self.sessions.remove(session.session_id)

    # --- turns ---------------------------------------------------------------

    def cancel_turn(self, session_id: str) -> None:
        self.bridge.sessions.cancel(session_id)

    async def cancel(self, session: AcpSession, principal: str) -> None:
        """``session/cancel`` (and ``session/close``) of ``principal``'s session: as the
        bridge's ``session.cancel`` (which checks the owner as that principal)."""
        for relay in list(session.turns):
            relay.cancel()
        call = CallContext(None, "acp", principal)
        await self.methods.session_cancel({"sessionId": session.session_id}, call, "session.cancel")

    async def cancel_prompt(self, relay: TurnRelay, principal: str) -> None:
        """``$/cancel_request`` of one prompt: as :meth:`cancel`, for that prompt only. A
        prompt still queued behind another turn of its thread leaves the queue and is
        answered ``cancelled`` at once (the relay's ``cancelled`` is the turn's
        ``CallContext.withdrawn``); one past the queue is cancelled when its turn starts
        (``TurnRelay._started``); the running one now, with its upstream."""
        if relay.cancel_requested:
            return
        relay.cancel()
        sid = relay.session.session_id
        running = self.bridge.sessions.running(sid)
        if relay.turn_id and (running is None or running.turn_id == relay.turn_id):
            call = CallContext(None, "acp", principal)
            await self.methods.session_cancel({"sessionId": sid}, call, "session.cancel")

    def takes_client_mcp(self, route: str) -> bool:
        """Does ``route`` give a session's ``mcpServers`` to its agent? Only an explicit
        stdio agent whose provider accepts client servers (``client_mcp_servers``):
        others would fail the turn, and an HTTP upstream or the router's choice would
        get the servers' env and headers."""
        kind, _, pid = route.partition(":")
        if kind.lower() != "single-agent":
            return False
        provider = next((p for p in self.config.available_providers if p.id == pid), None)
        return provider is not None and provider.is_stdio and provider.client_mcp_servers

    async def prepare_route(self, choice: Choice, conn: AcpConnection) -> None:
        """``gateway:openclaw`` needs a runtime of the caller's: connect one (config's URL and
        token) when it has none. A ``local`` runtime is the client's own
        (``xworkmate.gateway.connect`` with the same token)."""
        if choice.route.lower() != "gateway:openclaw":
            return
        gateway = self.bridge.gateway
        if gateway.find(conn.principal, "openclaw") is not None:
            return
        params = {"runtimeId": OPENCLAW_RUNTIME, "gatewayProviderId": "openclaw"}
        result: dict[str, Any] = await gateway.connect(
            params, conn.principal, None, None, conn.bearer
        )
        if result.get("ok") is not True:
            error = result.get("error")
            message = (
                coerce.text(error.get("message")) if isinstance(error, dict) else coerce.text(error)
            )
            raise RpcError(
                jsonrpc.INTERNAL_ERROR, f"cannot connect the openclaw gateway: {message}"
            )
