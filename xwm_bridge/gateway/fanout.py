"""Where a gateway runtime's notifications go (gateway.md §7, fixed: weakness 2).

Every call in flight on the runtime (connect, request, disconnect, gateway turn)
gets them, and so does every open WebSocket (or stdio) connection of the owner
that has used the runtime; a finished HTTP/SSE response is never written to.
Each delivery is bounded by ``notify_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge import jsonrpc
from xwm_bridge.tasks import wait_for

Notify = Callable[[dict[str, Any]], Awaitable[None]]


class Fanout:
    def __init__(self, notify_timeout: float) -> None:
        self._timeout = notify_timeout
        self._sinks: dict[Notify, int] = {}  # request-scoped sinks (refcounted)
        self._live: set[Any] = set()  # owner's live connections (``.notify``, ``.closed``)

    def attach(self, notify: Notify | None, connection: Any | None) -> None:
        """Send notifications to a call in flight: over its long-lived connection when
        it has one (which also keeps getting them after the call), else to the call's
        own ``notify`` (an SSE response). Never both: the call's ``notify`` is a
        wrapper of the connection's, so each frame would arrive twice."""
        if connection is not None:
            self._live.add(connection)
        elif notify is not None:
            self._sinks[notify] = self._sinks.get(notify, 0) + 1

    def detach(self, notify: Notify | None, connection: Any | None = None) -> None:
        if connection is None and notify is not None:
            left = self._sinks.get(notify, 0) - 1
            if left > 0:
                self._sinks[notify] = left
            else:
                self._sinks.pop(notify, None)

    def has_live_owner(self) -> bool:
        self._live = {c for c in self._live if not c.closed}
        return bool(self._live)

    async def publish(self, method: str, params: dict[str, Any]) -> None:
        message = jsonrpc.notification(method, params)
        targets: list[Notify] = list(self._sinks)
        for conn in list(self._live):
            if conn.closed:
                self._live.discard(conn)
            elif conn.notify not in self._sinks:
                targets.append(conn.notify)
        if not targets:
            return
        await asyncio.gather(
            *(wait_for(t(message), self._timeout) for t in targets), return_exceptions=True
        )
