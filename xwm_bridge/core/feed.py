"""Live fan-out of ledger entries to catch-up streams (issue 6), in-process.

A subscriber gets every entry recorded for its session after it subscribed,
in order, through a bounded queue; a subscriber that falls ``max_pending``
behind is marked overflowed and dropped (its client reconnects with
``Last-Event-ID`` and catches up from the store).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from xwm_bridge.store.base import LedgerEntry
from xwm_bridge.tasks import wait_for

Entry = LedgerEntry


@dataclass(eq=False, slots=True)
class Subscription:
    session_id: str
    max_pending: int
    pending: deque[Entry] = field(default_factory=deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    #: the bridge is shutting down (:meth:`SessionFeed.end_all`): what is pending is
    #: still read, then the stream ends
    ended: bool = False

    def end(self) -> None:
        self.ended = True
        self._ready.set()  # wake the reader

    def offer(self, entry: Entry) -> None:
        if self.overflowed:
            return
        if len(self.pending) >= self.max_pending:
            self.overflowed = True
            self._ready.set()  # wake the reader so it ends the stream
            return
        self.pending.append(entry)
        self._ready.set()

    async def next(self, wait_s: float) -> Entry | None:
        """The next entry; None after ``wait_s`` seconds without one, on overflow, or
        once it ended and nothing is pending."""
        if not self.pending and not self.overflowed and not self.ended:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._ready.wait(), wait_s)
        if self.overflowed or not self.pending:
            return None
        return self.pending.popleft()


class SessionFeed:
    def __init__(self, max_pending: int = 1024) -> None:
        self._max_pending = max_pending
        self._subs: dict[str, set[Subscription]] = {}
        self._ended = False

    def subscribe(self, session_id: str) -> Subscription:
        sub = Subscription(session_id, self._max_pending)
        if self._ended:
            sub.end()
        self._subs.setdefault(session_id, set()).add(sub)
        return sub

    def end_all(self) -> None:
        """Shutdown, after the drain: every follower reads what is pending and ends, and
        one that subscribes from now on ends at once."""
        self._ended = True
        for subs in self._subs.values():
            for sub in subs:
                sub.end()

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.session_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.session_id]

    def publish(self, session_id: str, entry: Entry) -> None:
        subs = self._subs.get(session_id)
        if subs:
            for sub in subs:
                sub.offer(entry)

    def publish_many(self, session_id: str, entries: list[Entry]) -> None:
        """:meth:`publish` for entries recorded together (one lookup when nobody follows)."""
        subs = self._subs.get(session_id)
        if subs:
            for entry in entries:
                for sub in subs:
                    sub.offer(entry)

    def __len__(self) -> int:
        return sum(len(s) for s in self._subs.values())
