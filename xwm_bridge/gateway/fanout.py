"""Where a gateway runtime's notifications go (gateway.md §7, fixed: weakness 2).

Every call in flight on the runtime (connect, request, disconnect, gateway turn)
gets them, and so does every open WebSocket (or stdio) connection of the owner
that has used the runtime; a finished HTTP/SSE response is never written to.

:meth:`Fanout.publish` only queues: each target has its own bounded outbox and at
most one writer task (on the runtime's supervisor, while there is something to
write), which writes in order, each write cut at ``notify_timeout``. So a client
that stops reading holds back neither the socket reader (the responses to
``chat.send`` / ``chat.abort``) nor the other targets. A target whose outbox
overflows or whose write times out is dropped for the rest of its connection
(one warning, ``xwm_gateway_notify_dropped_total{reason}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge import jsonrpc
from xwm_bridge.tasks import STOP_GRACE, Supervisor, stop_all, wait_for

log = logging.getLogger("xwm_bridge.gateway")

Notify = Callable[[dict[str, Any]], Awaitable[None]]

#: messages one target may have waiting; past it the target is dropped
OUTBOX_SIZE = 256
#: why a target was dropped (the ``reason`` label of the metric)
DROP_REASONS = ("overflow", "timeout")
#: how long a close lets the writers empty their outboxes before it cancels them
DRAIN_WITHIN = STOP_GRACE
#: how long a close waits for the writers it cancelled
STOP_WITHIN = 5.0


class _Outbox:
    __slots__ = ("dropped", "moved", "notify", "queue", "queued", "sent", "task")

    def __init__(self, notify: Notify) -> None:
        self.notify = notify
        self.queue: deque[dict[str, Any]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.dropped = False
        self.queued = 0  # messages ever queued
        self.sent = 0  # messages taken off and done with (written, failed or cut)
        self.moved = asyncio.Event()  # set when ``sent`` grows or the writer ends


class Fanout:
    def __init__(
        self,
        notify_timeout: float,
        tasks: Supervisor | None = None,
        name: str = "",
        drop_counts: dict[str, int] | None = None,
    ) -> None:
        self._timeout = notify_timeout
        self._tasks = tasks or Supervisor()
        self._name = name
        self._sinks: dict[Notify, int] = {}  # request-scoped sinks (refcounted)
        self._live: set[Any] = set()  # owner's live connections (``.notify``, ``.closed``)
        self._outboxes: dict[Notify, _Outbox] = {}
        #: targets dropped, by reason (shared with the manager: the metric)
        self.dropped = drop_counts if drop_counts is not None else dict.fromkeys(DROP_REASONS, 0)

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
        self._sweep()

    def has_live_owner(self) -> bool:
        self._sweep()
        return bool(self._live)

    def _sweep(self) -> list[Notify]:
        """Forget closed connections and detached sinks (their outboxes and writers go
        with them: a finished response is never written to); the targets left."""
        self._live = {c for c in self._live if not c.closed}
        targets = list(self._sinks)
        targets += [c.notify for c in self._live if c.notify not in self._sinks]
        for key in [k for k in self._outboxes if k not in targets]:
            box = self._outboxes.pop(key)
            box.queue.clear()
            if box.task is not None:
                box.task.cancel()
        return targets

    def publish(self, method: str, params: dict[str, Any]) -> None:
        """Queue one notification for every target; never waits."""
        targets = self._sweep()
        if not targets:
            return
        message = jsonrpc.notification(method, params)
        for target in targets:
            box = self._outboxes.get(target)
            if box is None:
                box = self._outboxes[target] = _Outbox(target)
            if box.dropped:
                continue
            if len(box.queue) >= OUTBOX_SIZE:
                self._drop(box, "overflow")
                continue
            box.queue.append(message)
            box.queued += 1
            if box.task is None:
                box.task = self._tasks.spawn(
                    self._write(box), name=f"gateway-notify:{self._name}", service=True
                )

    async def _write(self, box: _Outbox) -> None:
        """Empty one outbox in order, then end (the next message starts a new writer)."""
        try:
            while box.queue and not box.dropped:
                message = box.queue.popleft()
                try:
                    await wait_for(box.notify(message), self._timeout)
                except TimeoutError:
                    self._drop(box, "timeout")
                    return
                except Exception as exc:  # the target's own failure: the others go on
                    log.debug("gateway notification failed", extra={"error": repr(exc)})
                box.sent += 1
                box.moved.set()
        finally:
            if box.task is asyncio.current_task():
                box.task = None
            box.moved.set()

    def _drop(self, box: _Outbox, reason: str) -> None:
        box.dropped = True
        box.queue.clear()
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        log.warning(
            "gateway notifications to a client dropped: it stopped reading",
            extra={
                "runtime_id": self._name,
                "reason": reason,
                "outbox": OUTBOX_SIZE,
                "timeout_s": self._timeout,
            },
        )
        task = box.task
        if task is not None and task is not asyncio.current_task():
            task.cancel()  # its write still pending (an overflow): cut it now

    async def settle(self, notify: Notify | None, connection: Any | None) -> None:
        """Wait until a call's target has written what was queued for it so far (its
        notifications come before its answer), at most ``notify_timeout``."""
        key = connection.notify if connection is not None else notify
        box = self._outboxes.get(key) if key is not None else None
        if box is None:
            return
        goal = box.queued
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._timeout):
                while box.sent < goal and box.task is not None and not box.dropped:
                    box.moved.clear()
                    await box.moved.wait()

    async def close(self) -> None:
        """The runtime's final close: let the writers empty their outboxes for
        :data:`DRAIN_WITHIN` at most, then cancel the rest and wait for them."""
        boxes, self._outboxes = list(self._outboxes.values()), {}
        tasks = {box.task for box in boxes if box.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=min(self._timeout, DRAIN_WITHIN))
            await stop_all(tasks, STOP_WITHIN)
