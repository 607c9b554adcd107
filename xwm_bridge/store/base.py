"""The session store interface, its records, and the in-memory implementation.

A store keeps what a session needs to survive a restart: the record (thread,
provider binding, upstream session ids, prompt history, ``seq``, the last event
id, last turn id and status) and a bounded ledger of the notifications and final
results of recent turns, which ``session.replay`` and the SSE catch-up stream
read back.

Writes (:meth:`SessionStore.save`, :meth:`append`, :meth:`delete`) never block
the event loop: an implementation queues them and applies them in order.
Reads are coroutines and observe every write queued before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from xwm_bridge import jsonrpc
from xwm_bridge.store.records import (
    MAX_PROMPT_CHARS,
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)

log = logging.getLogger("xwm_bridge.store")

#: ``last_turn_status`` values
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
INTERRUPTED = "interrupted"

INTERRUPTED_MESSAGE = "turn interrupted: the bridge restarted while it was running"


class StoreError(Exception):
    """The store cannot be opened or reached; the message names it (never a password)."""


#: Not frozen: built twice per turn on the hot path, where a frozen dataclass's
#: ``object.__setattr__`` per field costs 3x; treat instances as immutable (they are
#: handed to the store's writer), and use ``dataclasses.replace`` to change one.
@dataclass(slots=True)
class SessionRecord:
    session_id: str
    thread_id: str
    provider: str = ""
    history: tuple[str, ...] = ()
    seq: int = 0
    last_turn_id: str = ""
    last_turn_status: str = ""
    #: upstream session ids, e.g. ``acpSessionId`` / ``acpCwd`` / ``gatewaySessionKey``
    upstream: tuple[tuple[str, str], ...] = ()
    updated_at: float = field(default_factory=time.time)
    #: the event id of the session's last ledger entry (see :class:`LedgerEntry`)
    events: int = 0


#: ledger entry kinds: a notification sent to the client, or a turn's final result
NOTIFICATION = "notification"
RESULT = "result"


#: Not frozen: built twice per turn on the hot path, where a frozen dataclass's
#: ``object.__setattr__`` per field costs 3x; treat instances as immutable (they are
#: handed to the store's writer), and use ``dataclasses.replace`` to change one.
@dataclass(slots=True)
class LedgerEntry:
    """One notification sent to the client during a turn, or the turn's final result.

    Two positions:

    * ``event_id`` — distinct and increasing per session (1, 2, 3, … from the
      session's start, every entry counted): the SSE ``id:``, ``Last-Event-ID``
      and ``session.replay``'s ``afterEventId``;
    * ``pos`` orders entries against the bridge ``seq``: a bridge
      ``session.update`` with seq N has pos 2N; an upstream frame relayed after
      it, or the turn's result, has pos 2N+1, so "everything after seq N" is
      ``pos > 2N``.
    """

    pos: int
    turn_id: str
    message: dict[str, Any]
    ts: float = field(default_factory=time.time)
    event_id: int = 0
    kind: str = NOTIFICATION


def emitted_pos(seq: int) -> int:
    return 2 * seq


def relayed_pos(seq: int) -> int:
    return 2 * seq + 1


@dataclass(frozen=True, slots=True)
class StoreLimits:
    ledger_max_entries: int = 512
    ledger_max_age: float = 3600.0
    #: sessions untouched this long are deleted from the store.
    retention: float = 7 * 86400.0


def interrupted_update(record: SessionRecord, seq: int) -> dict[str, Any]:
    """The ``session.update`` recorded for a turn that died with the process."""
    return jsonrpc.notification(
        "session.update",
        {
            "sessionId": record.session_id,
            "threadId": record.thread_id,
            "turnId": record.last_turn_id,
            "seq": seq,
            "type": "status",
            "event": "completed",
            "message": INTERRUPTED_MESSAGE,
            "pending": False,
            "error": True,
            "interrupted": True,
        },
    )


#: queued writes above which :meth:`SessionStore.writable` makes writers wait, the
#: level where they resume, and the longest wait (a stuck store must not hang turns)
BACKLOG_HIGH = 8192
BACKLOG_LOW = 2048
WRITABLE_WAIT = 10.0


class WriteBacklog:
    """Back-pressure on a store's write queue: above ``high`` queued writes,
    :meth:`writable` waits (at most ``wait_s``) until the queue's consumer, after a
    batch, finds it below ``low`` and calls :meth:`drained` (from any thread)."""

    def __init__(self, size: Callable[[], int], store: str) -> None:
        self.size = size
        self.store = store
        self.high = BACKLOG_HIGH
        self.low = BACKLOG_LOW
        self.wait_s = WRITABLE_WAIT
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def writable(self) -> None:
        if self.size() < self.high:
            return
        waiter = self._waiter
        if waiter is None or waiter.done():
            self._loop = asyncio.get_running_loop()
            waiter = self._waiter = self._loop.create_future()
            log.warning(
                "session store is behind: turns wait for it",
                extra={"store": self.store, "queued": self.size()},
            )
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait_s)
        except TimeoutError:
            log.error(
                "session store still behind; writing on",
                extra={"store": self.store, "queued": self.size(), "waited_s": self.wait_s},
            )

    def drained(self) -> None:
        waiter, loop = self._waiter, self._loop
        if waiter is None or loop is None or waiter.done() or self.size() >= self.low:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed
            loop.call_soon_threadsafe(_wake, waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SessionStore(Protocol):
    name: str

    async def start(self) -> None: ...

    async def writable(self) -> None:
        """Return once the queued writes are below the store's high-water mark (at once,
        usually). A writer of many entries (a streaming turn) awaits it, so a store
        that falls behind slows the writers instead of growing its queue without bound."""

    def save(self, record: SessionRecord) -> None:
        """Queue an upsert of the record."""

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        """Queue one ledger entry (pruned to the configured size and age)."""

    def delete(self, session_id: str) -> None:
        """Queue removal of the record and its ledger."""

    async def load(self, session_id: str) -> SessionRecord | None:
        """The record, with ``seq`` at least the highest seq in its ledger."""

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        """The ledger entries after bridge update ``after_seq`` — or, when
        ``after_event`` is given, after that event id — oldest first. The read is
        queued synchronously when the coroutine is first awaited: it sees every
        write queued before (the Redis store may also show writes queued just after)."""

    async def recover(self) -> list[str]:
        """Mark turns left ``running`` by a dead process as interrupted; their ids."""

    async def prune(self) -> int:
        """Drop sessions past retention and ledger entries past age; how many sessions."""

    async def close(self) -> None:
        """Apply every queued write, then release resources."""

    # --- operator views (issue 13) ---------------------------------------------------------

    def save_turn(self, record: TurnRecord) -> None:
        """Queue an upsert of one turn (by session and turn id); the newest
        ``TURNS_PER_SESSION`` of a session are kept."""

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        """The session's newest ``limit`` turns, oldest first."""

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        """Records matching the query, newest ``updated_at`` first, each with its last turn."""

    def save_permission(self, record: PermissionRecord) -> None:
        """Queue an upsert of a pending permission request."""

    def delete_permission(self, session_id: str, request_id: str) -> None:
        """Queue removal of a permission request (it was resolved)."""

    async def permissions(self) -> list[PermissionRecord]:
        """Pending permission requests, oldest first. ``recover`` drops those left by a
        dead process."""

    async def health(self, deadline_s: float = 5.0) -> str:
        """ "" when the running store can read and write within ``deadline_s`` seconds
        (and its last write succeeded), else the reason, naming the store (never a
        password). For ``/readyz`` and ``doctor`` (``store.health.probe_store``)."""


def interrupted_turn(record: SessionRecord, stored: TurnRecord | None) -> TurnRecord:
    """The turn record of the session's last turn, which died with the process: the
    stored one (if a record was written) marked ``interrupted``, else one made from the
    session record (a running turn's record is only written when the turn ends)."""
    base = stored or TurnRecord(
        session_id=record.session_id,
        turn_id=record.last_turn_id,
        thread_id=record.thread_id,
        provider=record.provider,
        prompt=(record.history[-1] if record.history else "")[:MAX_PROMPT_CHARS],
        started_at=record.updated_at,
    )
    return replace(base, status=INTERRUPTED, finished_at=time.time(), error=INTERRUPTED_MESSAGE)


def _recovered(
    record: SessionRecord, ledger_seq: int, ledger_events: int = 0
) -> tuple[SessionRecord, LedgerEntry]:
    seq = max(record.seq, ledger_seq) + 1
    event = max(record.events, ledger_events) + 1
    message = interrupted_update(record, seq)
    entry = LedgerEntry(emitted_pos(seq), record.last_turn_id, message, event_id=event)
    fixed = replace(
        record, seq=seq, events=event, last_turn_status=INTERRUPTED, updated_at=time.time()
    )
    return fixed, entry


def selected(entry: LedgerEntry, after_seq: int, after_event: int | None) -> bool:
    """Whether a replay after ``after_seq`` (or ``after_event``) includes ``entry``."""
    if after_event is not None:
        return entry.event_id > after_event
    return entry.pos > emitted_pos(after_seq)


class MemoryStore:
    """Process-local store: today's behaviour (nothing survives a restart)."""

    name = "memory"

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        self._records: dict[str, SessionRecord] = {}
        self._ledgers: dict[str, deque[LedgerEntry]] = {}
        self._turns: dict[str, dict[str, TurnRecord]] = {}
        self._permissions: dict[tuple[str, str], PermissionRecord] = {}

    async def start(self) -> None:
        return None

    async def writable(self) -> None:
        return None  # writes are applied at once

    def save(self, record: SessionRecord) -> None:
        self._records[record.session_id] = record

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        ledger = self._ledgers.get(session_id)
        if ledger is None:
            ledger = self._ledgers[session_id] = deque(maxlen=self._limits.ledger_max_entries)
        ledger.append(entry)

    def delete(self, session_id: str) -> None:
        self._records.pop(session_id, None)
        self._ledgers.pop(session_id, None)
        self._turns.pop(session_id, None)
        for key in [k for k in self._permissions if k[0] == session_id]:
            del self._permissions[key]

    def _ledger_seq(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return max((e.pos // 2 for e in ledger), default=0) if ledger else 0

    def _ledger_events(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return ledger[-1].event_id if ledger else 0

    async def load(self, session_id: str) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is None:
            return None
        return replace(
            record,
            seq=max(record.seq, self._ledger_seq(session_id)),
            events=max(record.events, self._ledger_events(session_id)),
        )

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        horizon = time.time() - self._limits.ledger_max_age
        out = [
            e
            for e in self._ledgers.get(session_id, ())
            if e.ts >= horizon and selected(e, after_seq, after_event)
        ]
        return out[:limit]

    async def recover(self) -> list[str]:
        self._permissions.clear()  # their turns died with the process
        ids = []
        for sid, record in list(self._records.items()):
            if record.last_turn_status == RUNNING:
                fixed, entry = _recovered(record, self._ledger_seq(sid), self._ledger_events(sid))
                self.save(fixed)
                self.append(sid, entry)
                stored = self._turns.get(sid, {}).get(record.last_turn_id)
                self.save_turn(interrupted_turn(record, stored))
                ids.append(sid)
        return ids

    async def prune(self) -> int:
        now = time.time()
        stale = [
            s for s, r in self._records.items() if now - r.updated_at >= self._limits.retention
        ]
        for sid in stale:
            self.delete(sid)
        horizon = now - self._limits.ledger_max_age
        for ledger in self._ledgers.values():
            while ledger and ledger[0].ts < horizon:
                ledger.popleft()
        return len(stale)

    async def close(self) -> None:
        return None

    def save_turn(self, record: TurnRecord) -> None:
        turns = self._turns.setdefault(record.session_id, {})
        turns[record.turn_id] = record
        while len(turns) > TURNS_PER_SESSION:
            del turns[min(turns, key=lambda t: (turns[t].started_at, t))]

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        turns = sorted(self._turns.get(session_id, {}).values(), key=_turn_order)
        return turns[-limit:] if limit > 0 else []

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        rows = sorted(
            (r for r in self._records.values() if query.matches(r)),
            key=lambda r: (r.updated_at, r.session_id),
            reverse=True,
        )
        page = rows[: query.limit]
        items = [(r, self._turns.get(r.session_id, {}).get(r.last_turn_id)) for r in page]
        more = len(rows) > query.limit
        return SessionPage(items, (page[-1].updated_at, page[-1].session_id) if more else None)

    def save_permission(self, record: PermissionRecord) -> None:
        self._permissions[record.key] = record

    def delete_permission(self, session_id: str, request_id: str) -> None:
        self._permissions.pop((session_id, request_id), None)

    async def permissions(self) -> list[PermissionRecord]:
        return sorted(self._permissions.values(), key=lambda p: (p.created_at, p.request_id))

    async def health(self, deadline_s: float = 5.0) -> str:
        return ""


def _turn_order(t: TurnRecord) -> tuple[float, str]:
    return (t.started_at, t.turn_id)


recovered = _recovered
