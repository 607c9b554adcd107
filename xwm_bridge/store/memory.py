"""The in-memory session store (backend ``memory``): nothing survives a restart.

Bounded by count, age and bytes: each session's ledger keeps the newest entries
that fit in ``ledger_max_bytes`` (and always the newest one), its newest
``TURNS_PER_SESSION`` turn records, and all sessions together (ledgers, prompt
histories, turn and permission records) fit in ``memory_max_bytes`` — past it, the
oldest ledger entries and turn records of any session go first (oldest written
first), then the permission records of sessions gone, then the least recently saved
sessions, never one whose turn is running (its record, turns and pending permission
requests stay while it runs). Turn records of sessions gone are dropped by ``prune``.
An entry or a turn or permission record that cannot be encoded (and so could never be
sent back) is dropped and counted, as the other stores do.

Ledger entries are kept encoded, as plain tuples of atomic values (see
:data:`Kept`), and decoded only when replayed: the message's encoding is what the
byte bound counts anyway, and a ledger of tens of thousands of entries then adds
no object the garbage collector has to walk (holding the decoded dicts made the
collector a third of the daemon's CPU in a streamed bench). Turn and permission
records are kept encoded too, with the key their view sorts by: a view returns
copies, as the SQLite and Redis stores do.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Final, TypeAlias

import orjson

from xwm_bridge.observability.logging import capped
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

#: a kept entry: (pos, turn_id, ts, event_id, kind, encoded message, size). An exact
#: tuple of atomic values, which the garbage collector stops tracking.
Kept: TypeAlias = tuple[int, str, float, int, str, bytes, int]
_POS: Final = 0
_TS: Final = 2
_EVENT: Final = 3
_SIZE: Final = 6


def _entry(kept: Kept) -> LedgerEntry:
    pos, turn_id, ts, event_id, kind, raw, _ = kept
    return LedgerEntry(pos, turn_id, orjson.loads(raw), ts=ts, event_id=event_id, kind=kind)


def record_size(record: SessionRecord) -> int:
    return ENTRY_OVERHEAD + sum(map(len, record.history))


#: a kept turn or permission record: (its view's sort key, the encoded record, when it
#: was written); its size is ``len(raw) + ENTRY_OVERHEAD``
Held: TypeAlias = tuple[float, bytes, float]


class MemoryStore:
    name = "memory"

    def __init__(self, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        #: least recently saved first (a save moves a record to the end)
        self._records: dict[str, SessionRecord] = {}
        self._ledgers: dict[str, deque[Kept]] = {}
        self._ledger_bytes: dict[str, int] = {}
        #: every entry in append order, for the global cap (may hold removed ones)
        self._order: deque[tuple[str, Kept]] = deque()
        self._live_entries = 0
        self._bytes = 0
        #: session → turn id → (started_at, the encoded record, written at)
        self._turns: dict[str, dict[str, Held]] = {}
        #: every turn record in write order, for the global cap (may hold replaced ones)
        self._turn_order: deque[tuple[str, str, Held]] = deque()
        self._live_turns = 0
        #: (session, request id) → (created_at, the encoded record, written at)
        self._permissions: dict[tuple[str, str], Held] = {}
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

    def _dropped(self, op: str, session_id: str, exc: Exception) -> None:
        self.counters.bad_records += 1
        log.error(
            "session store dropped a record",
            extra={"op": op, "session_id": session_id[:128], "error": capped(f"{exc}", 300)},
        )

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        try:
            raw = orjson.dumps(entry.message)
        except TypeError as exc:  # e.g. nested deeper than orjson writes
            self._dropped("append", session_id, exc)
            return
        size = len(raw) + ENTRY_OVERHEAD
        kept = (entry.pos, entry.turn_id, entry.ts, entry.event_id, entry.kind, raw, size)
        ledger = self._ledgers.get(session_id)
        if ledger is None:
            ledger = self._ledgers[session_id] = deque()
        ledger.append(kept)
        self._order.append((session_id, kept))
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

    def append_many(self, session_id: str, entries: Sequence[LedgerEntry]) -> None:
        for entry in entries:
            self.append(session_id, entry)

    def delete(self, session_id: str) -> None:
        record = self._records.pop(session_id, None)
        if record is not None:
            self._bytes -= record_size(record)
        self._drop_ledger(session_id)
        for turn_id in list(self._turns.get(session_id, ())):
            self._drop_turn(session_id, turn_id)
        for key in [k for k in self._permissions if k[0] == session_id]:
            self.delete_permission(*key)

    def _pop_oldest(self, session_id: str, ledger: deque[Kept]) -> None:
        size = ledger.popleft()[_SIZE]
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

    def _running(self, session_id: str) -> bool:
        record = self._records.get(session_id)
        return record is not None and record.last_turn_status == RUNNING

    def _enforce_global(self) -> None:
        cap = self._limits.memory_max_bytes
        order, turn_order = self._order, self._turn_order
        while self._bytes > cap and (order or turn_order):  # the oldest of any session first
            if not turn_order or (order and order[0][1][_TS] <= turn_order[0][2][2]):
                session_id, kept = order.popleft()
                ledger = self._ledgers.get(session_id)
                if ledger and ledger[0] is kept:
                    self._pop_oldest(session_id, ledger)
                continue
            session_id, turn_id, held = turn_order.popleft()
            current = self._turns.get(session_id, {}).get(turn_id) is held
            # a running session's stay (out of the order until saved again or the order
            # is rebuilt; they go with their session meanwhile)
            if current and not self._running(session_id):
                self._drop_turn(session_id, turn_id)
        if self._bytes > cap:  # then requests of sessions gone (closed while they ran)
            for key in [k for k in self._permissions if k[0] not in self._records]:
                self.delete_permission(*key)
        while self._bytes > cap:  # then the least recently saved sessions, not running ones
            victim = next(
                (s for s, r in self._records.items() if r.last_turn_status != RUNNING), None
            )
            if victim is None:  # only running turns' records are left: they stay
                break
            self.delete(victim)
        if len(self._order) > 2 * self._live_entries + 1024:  # forget removed entries
            live = [(sid, k) for sid, ledger in self._ledgers.items() for k in ledger]
            live.sort(key=lambda item: item[1][_TS])
            self._order = deque(live)
        if len(self._turn_order) > 2 * self._live_turns + 1024:
            turns = [(s, t, held) for s, kept in self._turns.items() for t, held in kept.items()]
            turns.sort(key=lambda item: item[2][2])
            self._turn_order = deque(turns)

    # --- reads ----------------------------------------------------------------------------

    def _ledger_seq(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return max((k[_POS] // 2 for k in ledger), default=0) if ledger else 0

    def _ledger_events(self, session_id: str) -> int:
        ledger = self._ledgers.get(session_id)
        return ledger[-1][_EVENT] if ledger else 0

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
        out: list[LedgerEntry] = []
        for kept in self._ledgers.get(session_id, ()):
            if len(out) >= limit:
                break
            if kept[_TS] >= horizon and _selected(kept, after_seq, after_event):
                out.append(_entry(kept))
        return out

    async def recover(self) -> list[str]:
        for key in list(self._permissions):  # their turns died with the process
            self.delete_permission(*key)
        ids = []
        for sid, record in list(self._records.items()):
            if record.last_turn_status == RUNNING:
                fixed, entry = recovered(record, self._ledger_seq(sid), self._ledger_events(sid))
                self.save(fixed)
                self.append(sid, entry)
                self.save_turn(interrupted_turn(record, self._turn(sid, record.last_turn_id)))
                ids.append(sid)
        return ids

    async def prune(self) -> int:
        now = time.time()
        stale = [  # not a session whose turn is running: a turn may outlast the retention
            s
            for s, r in self._records.items()
            if now - r.updated_at >= self._limits.retention and r.last_turn_status != RUNNING
        ]
        for sid in stale:
            self.delete(sid)
        horizon = now - self._limits.ledger_max_age
        for sid, ledger in list(self._ledgers.items()):
            while ledger and ledger[0][_TS] < horizon:
                self._pop_oldest(sid, ledger)
        # turn records of sessions gone (one finished after its session was closed), as
        # the SQLite store's prune does: nothing else would ever remove them
        for sid in [s for s in self._turns if s not in self._records]:
            for turn_id in list(self._turns[sid]):
                self._drop_turn(sid, turn_id)
        return len(stale)

    async def close(self) -> None:
        return None

    # --- operator views (issue 13) ---------------------------------------------------------

    def save_turn(self, record: TurnRecord) -> None:
        try:
            raw = record.dumps()
        except TypeError as exc:  # e.g. a result nested deeper than orjson writes
            self._dropped("save_turn", record.session_id, exc)
            return
        sid = record.session_id
        self._drop_turn(sid, record.turn_id)  # a turn's record saved again replaces it
        held = (record.started_at, raw, time.time())
        turns = self._turns.setdefault(sid, {})
        turns[record.turn_id] = held
        self._turn_order.append((sid, record.turn_id, held))
        self._live_turns += 1
        self._bytes += len(raw) + ENTRY_OVERHEAD
        while len(turns) > TURNS_PER_SESSION:
            self._drop_turn(sid, min(turns, key=lambda t: (turns[t][0], t)))
        self._enforce_global()

    def _drop_turn(self, session_id: str, turn_id: str) -> None:
        turns = self._turns.get(session_id)
        held = turns.pop(turn_id, None) if turns is not None else None
        if held is None:
            return
        self._bytes -= len(held[1]) + ENTRY_OVERHEAD
        self._live_turns -= 1
        if not turns:
            del self._turns[session_id]

    def _turn(self, session_id: str, turn_id: str) -> TurnRecord | None:
        kept = self._turns.get(session_id, {}).get(turn_id)
        return TurnRecord.loads(kept[1]) if kept is not None else None

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        if limit <= 0:
            return []
        kept = sorted(self._turns.get(session_id, {}).items(), key=lambda t: (t[1][0], t[0]))
        return [TurnRecord.loads(held[1]) for _, held in kept[-limit:]]

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        rows = sorted(
            (r for r in self._records.values() if query.matches(r)),
            key=lambda r: (r.updated_at, r.session_id),
            reverse=True,
        )
        page = rows[: query.limit]
        items = [(r, self._turn(r.session_id, r.last_turn_id)) for r in page]
        more = len(rows) > query.limit
        return SessionPage(items, (page[-1].updated_at, page[-1].session_id) if more else None)

    def save_permission(self, record: PermissionRecord) -> None:
        try:
            raw = record.dumps()
        except TypeError as exc:  # e.g. options nested deeper than orjson writes
            self._dropped("save_permission", record.session_id, exc)
            return
        self.delete_permission(*record.key)  # saved again: replaced
        self._permissions[record.key] = (record.created_at, raw, time.time())
        self._bytes += len(raw) + ENTRY_OVERHEAD
        self._enforce_global()

    def delete_permission(self, session_id: str, request_id: str) -> None:
        held = self._permissions.pop((session_id, request_id), None)
        if held is not None:
            self._bytes -= len(held[1]) + ENTRY_OVERHEAD

    async def permissions(self) -> list[PermissionRecord]:
        kept = sorted(self._permissions.items(), key=lambda p: (p[1][0], p[0][1]))
        return [PermissionRecord.loads(held[1]) for _, held in kept]


def _selected(kept: Kept, after_seq: int, after_event: int | None) -> bool:
    pos, _, _, event_id = kept[:4]
    return selected(LedgerEntry(pos, "", {}, event_id=event_id), after_seq, after_event)
