"""The session store interface, its records, and the in-memory implementation.

A store keeps what a session needs to survive a restart: the record (thread,
provider binding, upstream session ids, prompt history, ``seq``, the last event
id, last turn id and status) and a bounded ledger of the notifications and final
results of recent turns, which ``session.replay`` and the SSE catch-up stream
read back.

Writes (:meth:`SessionStore.save`, :meth:`append`, :meth:`delete`) never block
the event loop: an implementation queues them and applies them in order.
Reads are coroutines and observe every write queued before them.

A bad record (one that cannot be encoded or bound) never stops the writer: it
is dropped, logged and counted in :class:`StoreCounters`, and the writes queued
around it are applied. :meth:`SessionStore.health` is what ``/readyz`` and
``doctor`` ask.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from xwm_bridge import jsonrpc
from xwm_bridge.observability.logging import capped
from xwm_bridge.store.records import (
    MAX_PROMPT_CHARS,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)
from xwm_bridge.tasks import wait_for

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


class StoreUnavailable(StoreError):
    """A read the store could not answer (its backend down, or too slow): the request
    that needed it fails, said so, with no traceback; the message is for the log."""


#: deadline of one health probe (``/readyz`` answers within it)
HEALTH_TIMEOUT = 2.0
#: a failed real write keeps the store unhealthy this long, whatever its probe says
RECENT_ERROR_S = 30.0


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """The answer of :meth:`SessionStore.health`: which check ran, and how it went."""

    backend: str
    #: ``writable`` (SQLite: a probe row written), ``reachable`` (Redis: PING),
    #: ``running`` (the writer thread or task is alive)
    check: str
    ok: bool
    #: why not, naming the store (never a password)
    error: str = ""
    #: what was found, when it is fine (doctor prints it)
    detail: str = ""

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "check": self.check, "ok": self.ok}
        if self.error:
            out["error"] = self.error
        return out


@dataclass(slots=True)
class StoreCounters:
    """What went wrong in the writer, for metrics (``xwm_store_*``) and logs."""

    #: records dropped because they could not be encoded or bound (one bad record)
    bad_records: int = 0
    #: writes the backend refused (disk full, read-only file, Redis down) or a bug failed
    write_errors: int = 0
    #: times the writer loop or thread was restarted after an unexpected error
    restarts: int = 0
    #: periodic prunes that failed (counted by the bridge's reaper: a store outage)
    prune_errors: int = 0
    #: the last backend error, cleared by the next successful write batch
    last_error: str = ""
    #: when it happened (``time.monotonic()``)
    failed_at: float = 0.0

    def failed(self, error: str) -> None:
        self.last_error = capped(error, 300)
        self.failed_at = time.monotonic()

    def recent_error(self) -> str:
        """The last backend error if it is recent (:data:`RECENT_ERROR_S`): a health
        probe's own small write going through does not clear it then (a disk nearly
        full can take the probe's row and refuse a batch of real writes)."""
        if self.last_error and time.monotonic() - self.failed_at < RECENT_ERROR_S:
            return self.last_error
        return ""

    def probe_passed(self) -> str:
        """A health probe's write went through: the recent error that still makes the
        store unhealthy, else "" (and the last error is cleared: the backend is back)."""
        recent = self.recent_error()
        if not recent:
            self.last_error = ""
        return recent


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
    #: the principal that created the session (a digest of its bearer); "" = unowned
    owner: str = ""
    #: prompts the session has had in all (``history`` holds the newest of them);
    #: below ``len(history)`` (a record from before it was counted), that length
    prompts: int = 0
    #: which in-memory session this is a snapshot of (0: none); a store may tell by
    #: it that two saves hold the same history but for the prompts added in between
    history_id: int = field(default=0, compare=False)


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


MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreLimits:
    ledger_max_entries: int = 512
    ledger_max_age: float = 3600.0
    #: sessions untouched this long are deleted from the store.
    retention: float = 7 * 86400.0
    #: encoded bytes of one session's ledger: the newest entries that fit are kept
    ledger_max_bytes: int = 8 * MIB
    #: the in-memory store, every session together (ledgers, prompt histories, turn and
    #: permission records): the oldest ledger entries and turn records go first, then
    #: the least recently saved sessions (not one whose turn is running)
    memory_max_bytes: int = 256 * MIB


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
            await wait_for(asyncio.shield(waiter), self.wait_s)
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
    counters: StoreCounters

    async def start(self) -> None: ...

    async def writable(self) -> None:
        """Return once the queued writes are below the store's high-water mark (at once,
        usually). A writer of many entries (a streaming turn) awaits it, so a store
        that falls behind slows the writers instead of growing its queue without bound."""

    def alive(self) -> bool:
        """The writer runs and its last batch was accepted (cheap: no I/O; for metrics)."""

    async def health(self, deadline_s: float = HEALTH_TIMEOUT) -> StoreHealth:
        """Probe the running store within ``deadline_s``; never raises. A writer found
        dead is restarted first. ``/readyz`` asks it; ``doctor`` asks
        ``store.health.probe_store`` (which starts nothing) for the same answer."""

    def save(self, record: SessionRecord) -> None:
        """Queue an upsert of the record."""

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        """Queue one ledger entry (pruned to the configured size and age)."""

    def append_many(self, session_id: str, entries: Sequence[LedgerEntry]) -> None:
        """Queue entries sent together, in order (typically one upstream read's frames:
        same position and turn, consecutive event ids). Reads see them as if appended
        one by one; a store may keep them in one row."""

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


recovered = _recovered
