"""The bridge-wide event log behind ``bridge.watch`` (issue 13): bounded, sans-I/O.

Everything an operator watches — sessions, turns and their streamed updates,
queue depths, provider/agent/gateway health, permission requests — is published
here as a frozen :class:`WatchEvent` with a strictly increasing ``seq``. The log
keeps the newest ``capacity`` events (and, apart, the newest ``samples``
metric samples, so that a busy feed never pushes the charts' history out), and
fans each new event out to subscribers through bounded queues.

A watcher reconnects with ``since=<cursor>`` and gets every event after it that
the log still holds; a cursor older than the log (or from an earlier process:
the cursor carries the process's epoch) is answered with ``reset`` so the
watcher re-reads the snapshots (``session.list``, ``permission.list``). A slow
subscriber never blocks :meth:`EventLog.publish`: once it falls ``max_pending``
behind it is marked overflowed and its watch call ends; it re-watches with
its last cursor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.tasks import wait_for

#: event kinds; ``metrics`` samples live in their own ring
KINDS = ("session", "turn", "queue", "health", "permission", "metrics")
SAMPLE_KIND = "metrics"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    seq: int
    kind: str
    type: str
    data: dict[str, Any]
    session_id: str = ""
    ts: float = field(default_factory=time.time)

    def wire(self, epoch: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cursor": format_cursor(epoch, self.seq),
            "seq": self.seq,
            "ts": self.ts,
            "kind": self.kind,
            "type": self.type,
        }
        if self.session_id:
            out["sessionId"] = self.session_id
        out.update(self.data)
        return out


def format_cursor(epoch: str, seq: int) -> str:
    return f"{epoch}:{seq}"


#: the most digits a cursor's seq may have (a seq is a count of events: 20 fit any)
MAX_SEQ_DIGITS = 20


def parse_cursor(text: str) -> tuple[str, int] | None:
    """``"<epoch>:<seq>"`` → (epoch, seq); None when malformed. ``seq`` is ASCII
    digits only (``str.isdigit`` also passes ``"²"``, which ``int`` refuses) and at
    most :data:`MAX_SEQ_DIGITS` of them (past 4300, ``int`` refuses them too)."""
    epoch, sep, seq = text.strip().rpartition(":")
    if not sep or not epoch or not (seq.isascii() and seq.isdigit()) or len(seq) > MAX_SEQ_DIGITS:
        return None
    return epoch, int(seq)


@dataclass(frozen=True, slots=True)
class WatchFilter:
    kinds: frozenset[str] = frozenset()
    session_id: str = ""

    def matches(self, event: WatchEvent) -> bool:
        if self.kinds and event.kind not in self.kinds:
            return False
        return not self.session_id or event.session_id in ("", self.session_id)


@dataclass(eq=False, slots=True)
class WatchSubscription:
    filter: WatchFilter
    max_pending: int
    pending: deque[WatchEvent] = field(default_factory=deque)
    overflowed: bool = False
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def offer(self, event: WatchEvent) -> None:
        if self.overflowed or not self.filter.matches(event):
            return
        if len(self.pending) >= self.max_pending:
            self.overflowed = True
            self.pending.clear()
            self._ready.set()
            return
        self.pending.append(event)
        self._ready.set()

    def drain(self, limit: int) -> list[WatchEvent]:
        out: list[WatchEvent] = []
        while self.pending and len(out) < limit:
            out.append(self.pending.popleft())
        return out

    async def wait(self, wait_s: float) -> bool:
        """Until an event is pending (True) or ``wait_s`` seconds pass (False)."""
        if self.pending or self.overflowed:
            return True
        self._ready.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(self._ready.wait(), wait_s)
        return bool(self.pending) or self.overflowed


@dataclass(frozen=True, slots=True)
class Catchup:
    """What a watcher arriving with ``since`` gets first."""

    events: list[WatchEvent]
    #: the cursor was unknown or older than the log: re-read the snapshots
    reset: bool
    #: the cursor after the last event the log holds now
    head: int


class EventLog:
    def __init__(self, capacity: int = 4096, samples: int = 180, max_pending: int = 2048) -> None:
        self.epoch = secrets.token_hex(4)
        self._seq = itertools.count(1)
        self._head = 0
        self._events: deque[WatchEvent] = deque(maxlen=max(1, capacity))
        self._samples: deque[WatchEvent] = deque(maxlen=max(1, samples))
        self._max_pending = max_pending
        self._subs: set[WatchSubscription] = set()
        #: events ever dropped off the front of the main ring
        self.dropped = 0
        #: turn, session and permission events are recorded from the first cursor handed
        #: out (a watch, or a list's ``watchCursor``) on: no cursor can predate it, and a
        #: bridge nobody watches pays nothing per turn
        #: (metric samples are recorded always: the charts' history)
        self.recording = False

    @property
    def head(self) -> int:
        return self._head

    @property
    def cursor(self) -> str:
        """Where a watcher starts; handing one out starts :attr:`recording` (the holder
        may come back with it)."""
        self.recording = True
        return format_cursor(self.epoch, self._head)

    def __len__(self) -> int:
        return len(self._events)

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def publish(
        self, kind: str, type_: str, data: dict[str, Any], session_id: str = ""
    ) -> WatchEvent | None:
        """Record one event and offer it to every subscriber (never blocks); None when
        not recording yet (see :attr:`recording`)."""
        if not self.recording and kind != SAMPLE_KIND:
            return None
        seq = next(self._seq)
        self._head = seq
        event = WatchEvent(seq, kind, type_, data, session_id)
        ring = self._samples if kind == SAMPLE_KIND else self._events
        if ring is self._events and len(ring) == ring.maxlen:
            self.dropped += 1
        ring.append(event)
        for sub in self._subs:
            sub.offer(event)
        return event

    def samples(self) -> list[WatchEvent]:
        """The held metric samples, oldest first (the charts' history)."""
        return list(self._samples)

    def subscribe(self, filt: WatchFilter | None = None) -> WatchSubscription:
        self.recording = True
        sub = WatchSubscription(filt or WatchFilter(), self._max_pending)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: WatchSubscription) -> None:
        self._subs.discard(sub)

    def catchup(self, since: str | None, filt: WatchFilter | None = None) -> Catchup:
        """Every held event after ``since`` (oldest first); ``reset`` when the log
        cannot prove nothing was missed. No cursor: the recent metric samples only
        (a new watcher starts from the snapshots)."""
        self.recording = True
        filt = filt or WatchFilter()
        if since is None or not since.strip():
            return Catchup(_matching(self._samples, 0, filt), False, self._head)
        parsed = parse_cursor(since)
        after = 0
        reset = True
        if parsed is not None and parsed[0] == self.epoch and parsed[1] <= self._head:
            after = parsed[1]
            oldest = self._events[0].seq if self._events else self._head + 1
            # nothing dropped after `after`: the oldest held event follows it directly
            reset = self.dropped > 0 and after < oldest - 1
        held = _matching(self._events, after, filt) + _matching(self._samples, after, filt)
        held.sort(key=lambda e: e.seq)
        return Catchup(held, reset, self._head)


def _matching(events: Iterable[WatchEvent], after: int, filt: WatchFilter) -> list[WatchEvent]:
    return [e for e in events if e.seq > after and filt.matches(e)]
