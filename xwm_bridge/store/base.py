"""The session store interface, its records, and the in-memory implementation.

A store keeps what a session needs to survive a restart: the record (thread,
provider binding, upstream session ids, prompt history, ``seq``, last turn id
and status) and a bounded ledger of the notifications of recent turns, which
``session.replay`` and the SSE catch-up stream read back.

Writes (:meth:`SessionStore.save`, :meth:`append`, :meth:`delete`) never block
the event loop: an implementation queues them and applies them in order.
Reads are coroutines and observe every write queued before them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from xwm_bridge import jsonrpc

#: ``last_turn_status`` values
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
INTERRUPTED = "interrupted"

INTERRUPTED_MESSAGE = "turn interrupted: the bridge restarted while it was running"


class StoreError(Exception):
    """The store cannot be opened or reached; the message names it (never a password)."""


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One notification sent to the client during a turn.

    ``pos`` orders entries against ``seq``: a bridge ``session.update`` with
    seq N has pos 2N; an upstream frame relayed after it has pos 2N+1, so
    "everything after seq N" is ``pos > 2N``.
    """

    pos: int
    turn_id: str
    message: dict[str, Any]
    ts: float = field(default_factory=time.time)


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


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """What :meth:`SessionStore.list_sessions` returns: newest first
    (``updated_at`` then ``session_id``, both descending), keyset-paged."""

    limit: int = 50
    #: only records whose upstream map has each of these keys, with that value
    #: (``None``: any value)
    upstream: tuple[tuple[str, str | None], ...] = ()
    #: ``(updated_at, session_id)`` of the last record of the previous page
    after: tuple[float, str] | None = None

    def matches(self, record: SessionRecord) -> bool:
        if self.after is not None and (record.updated_at, record.session_id) >= self.after:
            return False
        if not self.upstream:
            return True
        have = dict(record.upstream)
        return all(
            key in have and (value is None or have[key] == value) for key, value in self.upstream
        )


def newest_first(records: list[SessionRecord], query: SessionQuery) -> list[SessionRecord]:
    """One page of ``records`` for ``query`` (filtered, ordered, cut to ``limit``)."""
    hits = [r for r in records if query.matches(r)]
    hits.sort(key=lambda r: (r.updated_at, r.session_id), reverse=True)
    return hits[: max(query.limit, 0)]


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


class SessionStore(Protocol):
    name: str

    async def start(self) -> None: ...

    def save(self, record: SessionRecord) -> None:
        """Queue an upsert of the record."""

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        """Queue one ledger entry (pruned to the configured size and age)."""

    def delete(self, session_id: str) -> None:
        """Queue removal of the record and its ledger."""

    async def load(self, session_id: str) -> SessionRecord | None:
        """The record, with ``seq`` at least the highest seq in its ledger."""

    async def replay(
        self, session_id: str, after_seq: int, limit: int
    ) -> list[tuple[int, dict[str, Any]]]:
        """``(pos, message)`` of the ledger entries sent after bridge update
        ``after_seq``, oldest first. The read is queued synchronously when the
        coroutine is first awaited: it sees every write queued before (the Redis
        store may also show writes queued just after)."""

    async def list_sessions(self, query: SessionQuery) -> list[SessionRecord]:
        """One page of stored records, newest first (see :class:`SessionQuery`)."""

    async def recover(self) -> list[str]:
        """Mark turns left ``running`` by a dead process as interrupted; their ids."""

    async def prune(self) -> int:
        """Drop sessions past retention and ledger entries past age; how many sessions."""

    async def close(self) -> None:
        """Apply every queued write, then release resources."""


def _recovered(record: SessionRecord, ledger_seq: int) -> tuple[SessionRecord, LedgerEntry]:
    seq = max(record.seq, ledger_seq) + 1
    entry = LedgerEntry(emitted_pos(seq), record.last_turn_id, interrupted_update(record, seq))
    fixed = replace(record, seq=seq, last_turn_status=INTERRUPTED, updated_at=time.time())
    return fixed, entry


class MemoryStore:
    """Process-local store: today's behaviour (nothing survives a restart)."""

    name = "memory"

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        self._records: dict[str, SessionRecord] = {}
        self._ledgers: dict[str, deque[LedgerEntry]] = {}

    async def start(self) -> None:
        return None

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

    def _ledger_seq(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return max((e.pos // 2 for e in ledger), default=0) if ledger else 0

    async def load(self, session_id: str) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is None:
            return None
        return replace(record, seq=max(record.seq, self._ledger_seq(session_id)))

    async def replay(
        self, session_id: str, after_seq: int, limit: int
    ) -> list[tuple[int, dict[str, Any]]]:
        horizon = time.time() - self._limits.ledger_max_age
        floor = emitted_pos(after_seq)
        out = [
            (e.pos, e.message)
            for e in self._ledgers.get(session_id, ())
            if e.pos > floor and e.ts >= horizon
        ]
        return out[:limit]

    async def list_sessions(self, query: SessionQuery) -> list[SessionRecord]:
        return newest_first(list(self._records.values()), query)

    async def recover(self) -> list[str]:
        ids = []
        for sid, record in list(self._records.items()):
            if record.last_turn_status == RUNNING:
                fixed, entry = _recovered(record, self._ledger_seq(sid))
                self.save(fixed)
                self.append(sid, entry)
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


recovered = _recovered
