"""What a method handler and a turn executor are handed (the core's contracts).

``CallContext`` carries the per-request facts a transport knows; ``TurnContext``
what one running turn needs: its typed :class:`~xwm_bridge.core.turn.TurnRequest`,
the session record, and the two notification paths (client and ledger).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from xwm_bridge.core.sessions import Session
from xwm_bridge.core.turn import TurnRequest
from xwm_bridge.tasks import Supervisor

#: Deliver one JSON-RPC notification to the client; ``None`` when the transport
#: cannot carry notifications (plain-JSON HTTP).
Notify = Callable[[dict[str, Any]], Awaitable[None]]
#: Deliver several notifications, in order, in one write where the transport can (SSE).
NotifyMany = Callable[[list[dict[str, Any]]], Awaitable[None]]
#: Keep notifications sent together in the session's ledger, in order (``relayed``:
#: upstream frames, one entry each; a store may keep them in one row).
Ledger = Callable[[list[dict[str, Any]], bool], None]


class ClientRequests(Protocol):
    """Requests an agent makes that the *calling client* serves instead of the bridge.

    The ACP front door sets one per turn: a stdio agent's ``fs/*`` and
    ``terminal/*`` requests then go to the editor that declared those capabilities
    (it owns the buffers and the terminals). ``request`` raises
    :class:`~xwm_bridge.jsonrpc.RpcError` with the client's error (or ``-32800``
    when the turn was cancelled meanwhile).
    """

    def serves(self, method: str) -> bool: ...

    async def request(self, method: str, params: dict[str, Any]) -> Any: ...


class Connection(Protocol):
    """A long-lived client connection (WebSocket, stdio) that out-of-request
    notifications (gateway events) may use while it is open."""

    closed: bool
    notify: Notify


@dataclass(frozen=True, slots=True)
class CallContext:
    """Per-request facts from the transport."""

    notify: Notify | None
    transport: str
    #: the authenticated caller (a digest of its bearer credential, or the transport name).
    principal: str = ""
    #: the caller's bearer credential, only ever forwarded when config says so.
    bearer: str = field(default="", repr=False)
    #: the long-lived connection the call came on, if any.
    connection: Connection | None = None
    #: where the call came from (``host:port`` of the peer, ``stdio``), for audit records.
    peer: str = ""
    #: requests of the turn's agent that the calling client serves (ACP front door).
    client: ClientRequests | None = None
    #: the batch form of ``notify``, when the transport has a cheaper one.
    notify_many: NotifyMany | None = None
    #: done when the caller cancels the call (ACP ``session/cancel``,
    #: ``$/cancel_request``): a turn still waiting in its thread's queue then leaves it,
    #: and ``session.message`` raises :class:`~xwm_bridge.core.queues.WithdrawnError`.
    withdrawn: asyncio.Future[None] | None = None


#: One JSON-RPC method: ``(params, call, method name) -> result``; raises ``RpcError``.
Handler = Callable[[dict[str, Any], CallContext, str], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class TurnContext:
    turn: TurnRequest
    session: Session
    turn_id: str
    notify: Notify | None
    supervisor: Supervisor
    ledger: Ledger | None = None
    #: an operator watches the live feed (``bridge.watch``): stream from upstreams even
    #: when the client itself cannot receive notifications (plain-JSON HTTP)
    watched: bool = False
    #: agent requests the calling client serves (see :class:`ClientRequests`).
    client: ClientRequests | None = None
    #: the batch form of ``notify`` (see :class:`CallContext`).
    notify_many: NotifyMany | None = None
    #: awaited after ledger writes: returns once the session store keeps up
    #: (``SessionStore.writable``), so a store that falls behind slows the turn
    writable: Callable[[], Awaitable[None]] | None = None
    #: the long-lived connection the turn's call came on, if any (see :class:`CallContext`)
    connection: Connection | None = None

    @property
    def session_id(self) -> str:
        return self.turn.params.session_id

    @property
    def principal(self) -> str:
        return self.turn.principal

    @property
    def params(self) -> Mapping[str, Any]:
        """The turn's upstream params (client params with the routing applied)."""
        return self.turn.upstream

    async def relay(self, message: dict[str, Any]) -> None:
        """Pass an upstream notification through unchanged (contract.md §13.2)."""
        if self.ledger is not None:
            self.ledger([message], True)
            if self.writable is not None:
                await self.writable()
        if self.notify is not None:
            await self.notify(message)

    async def relay_many(self, messages: list[dict[str, Any]]) -> None:
        """:meth:`relay` for the frames that arrived together (one upstream read):
        one client write where the transport batches."""
        if self.ledger is not None:
            self.ledger(messages, True)
            if self.writable is not None:
                await self.writable()
        if self.notify_many is not None:
            await self.notify_many(messages)
        elif self.notify is not None:
            for message in messages:
                await self.notify(message)

    async def emit(self, payload: dict[str, Any]) -> None:
        """Send a bridge ``session.update`` stamped with the base fields and next seq."""
        params = {
            "sessionId": self.turn.params.session_id,
            "threadId": self.session.thread_id,
            "turnId": self.turn_id,
            "seq": self.session.next_seq(),
            **payload,
        }
        message = {"jsonrpc": "2.0", "method": "session.update", "params": params}
        if self.ledger is not None:
            self.ledger([message], False)
            if self.writable is not None:
                await self.writable()
        if self.notify is not None:
            await self.notify(message)

    async def emit_error(self, message: str) -> None:
        await self.emit(
            {
                "type": "status",
                "event": "completed",
                "message": message,
                "pending": False,
                "error": True,
            }
        )


STARTED_UPDATE: dict[str, Any] = {
    "type": "status",
    "event": "started",
    "message": "session started",
    "pending": True,
    "error": False,
}
