"""The in-memory session store (backend ``memory``): nothing survives a restart.

Bounded by count, age and bytes: each session's ledger keeps the newest entries
that fit in ``ledger_max_bytes`` (and always the newest one), and all sessions
together (ledgers plus prompt histories) fit in ``memory_max_bytes`` — past it,
the oldest ledger entries of any session go first, then the least recently saved
sessions. An entry that
cannot be encoded (and so could never be sent back) is dropped and counted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import replace

import orjson

from xwm_bridge.store.base import (
    HEALTH_TIMEOUT,
    RUNNING,
    LedgerEntry,
    SessionRecord,
    StoreCounters,
    StoreHealth,
    StoreLimits,
    interrupted_turn,
    recovered,
    selected,
)
from xwm_bridge.store.records import (
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)

log = logging.getLogger("xwm_bridge.store")
#: what an entry costs beyond its encoded message (the object, its deque slot)
ENTRY_OVERHEAD = 128


def record_size(record: SessionRecord) -> int:
    return ENTRY_OVERHEAD + sum(map(len, record.history))


class MemoryStore:
    name = "memory"

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        #: least recently saved first (a save moves a record to the end)
        self._records: dict[str, SessionRecord] = {}
        self._ledgers: dict[str, deque[tuple[LedgerEntry, int]]] = {}
        self._ledger_bytes: dict[str, int] = {}
        #: every entry in append order, for the global cap (may hold removed ones)
        self._order: deque[tuple[str, LedgerEntry]] = deque()
        self._live_entries = 0
        self._bytes = 0
        self._turns: dict[str, dict[str, TurnRecord]] = {}
        self._permissions: dict[tuple[str, str], PermissionRecord] = {}
        self.counters = StoreCounters()

    @property
    def bytes_held(self) -> int:
        return self._bytes

    async def start(self) -> None:
        return None

    async def writable(self) -> None:
        return None  # writes are applied at once

    def alive(self) -> bool:
        return True

    async def health(self, deadline_s: float = HEALTH_TIMEOUT) -> StoreHealth:
        return StoreHealth(self.name, "running", True, detail="memory: nothing survives a restart")

    # --- writes ---------------------------------------------------------------------------

    def save(self, record: SessionRecord) -> None:
        old = self._records.pop(record.session_id, None)
        if old is not None:
            self._bytes -= record_size(old)
        self._records[record.session_id] = record
        self._bytes += record_size(record)
        self._enforce_global()

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        try:
            size = len(orjson.dumps(entry.message)) + ENTRY_OVERHEAD
        except TypeError as exc:  # e.g. nested deeper than orjson writes
            self.counters.bad_records += 1
            log.error(
                "session store dropped a record",
                extra={"op": "append", "session_id": session_id[:128], "error": str(exc)},
            )
            return
        ledger = self._ledgers.get(session_id)
        if ledger is None:
            ledger = self._ledgers[session_id] = deque()
        ledger.append((entry, size))
        self._order.append((session_id, entry))
        self._live_entries += 1
        self._ledger_bytes[session_id] = self._ledger_bytes.get(session_id, 0) + size
        self._bytes += size
        limits = self._limits
        while ledger and (  # the newest entry always stays
            len(ledger) > limits.ledger_max_entries
            or (self._ledger_bytes[session_id] > limits.ledger_max_bytes and len(ledger) > 1)
        ):
            self._pop_oldest(session_id, ledger)
        self._enforce_global()

    def delete(self, session_id: str) -> None:
        record = self._records.pop(session_id, None)
        if record is not None:
            self._bytes -= record_size(record)
        self._drop_ledger(session_id)
        self._turns.pop(session_id, None)
        for key in [k for k in self._permissions if k[0] == session_id]:
            del self._permissions[key]

    def _pop_oldest(self, session_id: str, ledger: deque[tuple[LedgerEntry, int]]) -> None:
        _, size = ledger.popleft()
        self._ledger_bytes[session_id] -= size
        self._bytes -= size
        self._live_entries -= 1
        if not ledger:
            del self._ledgers[session_id]
            del self._ledger_bytes[session_id]

    def _drop_ledger(self, session_id: str) -> None:
        ledger = self._ledgers.pop(session_id, None)
        if ledger is not None:
            self._bytes -= self._ledger_bytes.pop(session_id)
            self._live_entries -= len(ledger)

    def _enforce_global(self) -> None:
        cap = self._limits.memory_max_bytes
        while self._bytes > cap and self._order:  # oldest entries of any session first
            session_id, entry = self._order.popleft()
            ledger = self._ledgers.get(session_id)
            if ledger and ledger[0][0] is entry:
                self._pop_oldest(session_id, ledger)
        while self._bytes > cap and self._records:  # then the least recently saved sessions
            oldest = next(iter(self._records))
            self.delete(oldest)
        if len(self._order) > 2 * self._live_entries + 1024:  # forget removed entries
            live = [(sid, e) for sid, ledger in self._ledgers.items() for e, _ in ledger]
            live.sort(key=lambda item: item[1].ts)
            self._order = deque(live)

    # --- reads ----------------------------------------------------------------------------

    def _ledger_seq(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return max((e.pos // 2 for e, _ in ledger), default=0) if ledger else 0

    def _ledger_events(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return ledger[-1][0].event_id if ledger else 0

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
            for e, _ in self._ledgers.get(session_id, ())
            if e.ts >= horizon and selected(e, after_seq, after_event)
        ]
        return out[:limit]

    async def recover(self) -> list[str]:
        self._permissions.clear()  # their turns died with the process
        ids = []
        for sid, record in list(self._records.items()):
            if record.last_turn_status == RUNNING:
                fixed, entry = recovered(record, self._ledger_seq(sid), self._ledger_events(sid))
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
        for sid, ledger in list(self._ledgers.items()):
            while ledger and ledger[0][0].ts < horizon:
                self._pop_oldest(sid, ledger)
        return len(stale)

    async def close(self) -> None:
        return None

    # --- operator views (issue 13) ---------------------------------------------------------

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


def _turn_order(t: TurnRecord) -> tuple[float, str]:
    return (t.started_at, t.turn_id)
