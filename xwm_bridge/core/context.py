"""What a turn executor is handed: ids, params, and the two notification paths."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from xwm_bridge.core.sessions import Session
from xwm_bridge.core.supervisor import Supervisor

#: Deliver one JSON-RPC notification to the client; ``None`` when the transport
#: cannot carry notifications (plain-JSON HTTP).
Notify = Callable[[dict[str, Any]], Awaitable[None]]
#: Keep one sent notification in the session's ledger (``relayed``: an upstream frame).
Ledger = Callable[[dict[str, Any], bool], None]


@dataclass(slots=True)
class TurnContext:
    method: str
    session: Session
    session_id: str
    turn_id: str
    exec_params: dict[str, Any]
    notify: Notify | None
    supervisor: Supervisor
    #: who asked (transport-derived, e.g. a digest of the bearer); owns gateway runtimes.
    principal: str = ""
    ledger: Ledger | None = None

    async def relay(self, message: dict[str, Any]) -> None:
        """Pass an upstream notification through unchanged (contract.md §13.2)."""
        if self.ledger is not None:
            self.ledger(message, True)
        if self.notify is not None:
            await self.notify(message)

    async def emit(self, payload: dict[str, Any]) -> None:
        """Send a bridge ``session.update`` stamped with the base fields and next seq."""
        params = {
            "sessionId": self.session_id,
            "threadId": self.session.thread_id,
            "turnId": self.turn_id,
            "seq": self.session.next_seq(),
            **payload,
        }
        message = {"jsonrpc": "2.0", "method": "session.update", "params": params}
        if self.ledger is not None:
            self.ledger(message, False)
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
