"""The SQLite store's thread: the one owner of the connection (``sqlite.py``).

It drains whatever is queued, applies the writes in one transaction (group commit:
writes gather for :data:`GROUP_COMMIT_S`), and answers reads after the writes
queued before them. A batch that fails is applied again one write at a time, and
only the writes that fail alone are dropped. It also keeps the per-session trim
counters: a ledger is trimmed every cap/8 entries, turn records every
:data:`TURN_TRIM_EVERY`, and the counters stay bounded (:data:`MAX_TRACKED_SESSIONS`).

:class:`StoreThread` is the base of :class:`~xwm_bridge.store.sqlite.SQLiteStore`:
the state and methods here are the thread's; the store's lifecycle, its queued
writes and its reads are in ``sqlite.py``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson

from xwm_bridge.store import sqlite_history
from xwm_bridge.store.base import (
    LedgerEntry,
    SessionRecord,
    StoreCounters,
    StoreLimits,
    WriteBacklog,
)
from xwm_bridge.store.records import TURNS_PER_SESSION
from xwm_bridge.store.sqlite_rows import insert_many
from xwm_bridge.store.sqlite_schema import connect
from xwm_bridge.store.sqlite_writes import (
    INSERT_ENTRY,
    TRIM_TURNS,
    UPSERT_SESSION,
    UPSERT_TURN,
    WRITES,
    Op,
    append_rows,
    apply_permission,
    delete,
    dropped,
    forget_oldest,
    live_writes,
    refused,
    session_row,
    trim_ledger,
    turn_row,
)

log = logging.getLogger("xwm_bridge.store")
MAX_BATCH = 2048
#: how long queued writes wait to share one transaction; the durability window
#: of a ``kill -9``
GROUP_COMMIT_S = 0.01

#: turn rows over TURNS_PER_SESSION are deleted every this many inserts per session
#: (reads take the newest). A trim sorts the session's rows, about 40 µs here: every
#: 32 inserts it is about 1 µs per turn, every 8 it was 5
TURN_TRIM_EVERY = 32
STOP: Op = ("stop",)

#: sessions whose trim counters (and largest entry) the store thread remembers; past
#: it, the oldest half is trimmed at once and forgotten (a daemon that sees a million
#: sessions keeps a few hundred KiB of counters, not a dict entry per session)
MAX_TRACKED_SESSIONS = 4096


def tally(
    appended: dict[str, list[int]], sid: str, entries: int, size: int, largest: int, top: int
) -> None:
    """Count one ledger row of a batch in ``appended[sid]``: ``[entries, their bytes,
    the largest entry, the newest event id]`` of the session's rows in the batch (0
    where none is larger)."""
    stat = appended.get(sid)
    if stat is None:
        stat = appended[sid] = [0, 0, 0, 0]
    stat[0] += entries
    stat[1] += size
    if largest > stat[2]:
        stat[2] = largest
    if top > stat[3]:
        stat[3] = top


class StoreThread:
    """What the store thread owns, and its loop."""

    #: made by the store (it names the store)
    backlog: WriteBacklog

    def __init__(self, path: Path, limits: StoreLimits) -> None:
        self.path = path
        self._limits = limits
        self._ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self._ready: Future[None] = Future()
        #: set by the store thread as it ends (close() waits for it)
        self._stopped: Future[None] = Future()
        self._wake = threading.Event()
        #: ledger entries (and their bytes) / turn records added per session since its
        #: last trim (store thread only)
        self._untrimmed: dict[str, int] = {}
        self._untrimmed_bytes: dict[str, int] = {}
        #: per session, the largest entry it holds (known once a byte trim has run in
        #: this process): while ``ledger_max_entries`` of them fit in
        #: ``ledger_max_bytes``, the count trim alone keeps the byte bound (store thread)
        self._largest: dict[str, int] = {}
        self._untrimmed_turns: dict[str, int] = {}
        #: which prompt rows the history table holds per session (store thread)
        self._histories = sqlite_history.HistoryWriter(MAX_TRACKED_SESSIONS)
        self.counters = StoreCounters()

    def _run(self, stopped: Future[None]) -> None:
        try:
            self._work()
        finally:
            stopped.set_result(None)

    def _work(self) -> None:
        if not self._ready.set_running_or_notify_cancel():
            return  # start() gave up before the thread ran
        try:
            db = connect(self.path)  # tuned, at the current layout
        except Exception as exc:  # reported to start()
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        try:
            while True:
                try:
                    self._serve(db)
                    return
                except Exception:  # a bug, not a bad record (those are handled per write)
                    self.counters.restarts += 1
                    log.exception("session store loop failed; it goes on")
        finally:
            db.close()

    def _serve(self, db: sqlite3.Connection) -> None:
        while True:
            batch = [self._ops.get()]
            if batch[0][0] not in ("call", "stop"):
                # group commit: let writes gather for GROUP_COMMIT_S (one transaction, and
                # no thread wake-up per write); a read or stop cuts the wait short
                self._wake.wait(GROUP_COMMIT_S)
            self._wake.clear()
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._ops.get_nowait())
                except queue.Empty:
                    break
            writes: list[Op] = []
            for op in batch:  # strictly in queue order: a read sees every earlier write
                if op[0] in WRITES:
                    writes.append(op)
                    continue
                self._flush(db, writes)
                if op[0] == "stop":
                    return
                _, fn, fut = op
                if not fut.set_running_or_notify_cancel():
                    continue  # the reader gave up
                try:
                    fut.set_result(fn(db))
                except Exception as exc:
                    fut.set_exception(exc)
            self._flush(db, writes)
            self.backlog.drained()

    def _flush(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        if not writes:
            return
        try:
            self._apply(db, writes)
        except Exception as exc:
            if refused(exc) or len(writes) == 1:
                dropped(writes, exc, self.counters)  # the backend refuses: retrying won't help
            else:
                self._isolate(db, writes)
        else:
            self.counters.last_error = ""
        writes.clear()

    def _trim_ledger(self, db: sqlite3.Connection, sid: str, top: int, added_largest: int) -> None:
        """:func:`sqlite_writes.trim_ledger` with the thread's per-session largest entry."""
        trim_ledger(db, sid, top, added_largest, self._limits, self._largest)

    def _forget(self, db: sqlite3.Connection) -> None:
        """Keep the per-session counters bounded (:data:`MAX_TRACKED_SESSIONS`,
        :func:`sqlite_writes.forget_oldest`)."""
        counters = (self._untrimmed, self._untrimmed_bytes, self._untrimmed_turns)
        forget_oldest(db, MAX_TRACKED_SESSIONS, self._limits, *counters, self._largest)

    def _isolate(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        """A batch failed on a bad record or a bug: apply its writes one by one, drop the bad."""
        traced: set[str] = set()  # a bug's traceback once per batch, not per write
        for op in writes:
            try:
                self._apply(db, [op])
            except Exception as exc:
                dropped([op], exc, self.counters, traceback=str(exc) not in traced)
                traced.add(str(exc))

    def _forget_session(self, sid: str) -> None:
        """A session deleted (a queued delete, or pruned): what the thread tracked of it
        goes too."""
        self._untrimmed.pop(sid, None)
        self._untrimmed_bytes.pop(sid, None)
        self._untrimmed_turns.pop(sid, None)
        self._largest.pop(sid, None)
        self._histories.forget(sid)

    def _apply(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        """One transaction, one ``executemany`` per table. Reordering by table is safe:
        after :func:`sqlite_writes.live_writes`, nothing live for a session precedes its delete, and
        the other tables do not depend on each other's order."""
        live = live_writes(writes)
        deletes: list[str] = []
        saves: list[tuple[Any, ...]] = []
        saved: list[SessionRecord] = []
        entries: list[tuple[Any, ...]] = []
        turns: list[tuple[Any, ...]] = []
        permissions: list[Op] = []
        appended: dict[str, list[int]] = {}  # per session: see tally()
        turned: dict[str, int] = {}
        # entries left out as unencodable: counted once this transaction commits (a
        # failed batch is applied again write by write, and would count them again)
        bad: list[tuple[Op, Exception]] = []
        for i, op in enumerate(writes):
            if i not in live:
                continue
            kind = op[0]
            if kind == "save":
                saves.append(session_row(op[1]))
                saved.append(op[1])
            elif kind == "append":
                sid, payload = op[1], op[2]
                if type(payload) is LedgerEntry:  # append(): one entry, its row built here
                    try:
                        raw = orjson.dumps(payload.message)
                    except TypeError as unencodable:  # e.g. nested deeper than orjson writes
                        bad.append((op, unencodable))
                        continue
                    e = payload
                    entries.append((sid, e.pos, e.turn_id, raw, e.ts, e.event_id, e.kind, 1))
                    tally(appended, sid, 1, len(raw), len(raw), e.event_id)
                    continue
                for row, entry_sizes in append_rows(sid, payload, bad):
                    entries.append(row)
                    top = row[5] + row[7] - 1
                    tally(appended, sid, len(entry_sizes), sum(entry_sizes), max(entry_sizes), top)
            elif kind == "turn":
                turns.append(turn_row(op[1]))
                turned[op[1].session_id] = turned.get(op[1].session_id, 0) + 1
            elif kind == "delete":
                deletes.append(op[1])
                self._forget_session(op[1])
            else:
                permissions.append(op)  # in their order: a request's save, then its delete
        # the trim counters as they were: a failed transaction puts them back, since its
        # writes are applied again one by one and would be counted a second time
        before = [
            (sid, self._untrimmed.get(sid), self._untrimmed_bytes.get(sid)) for sid in appended
        ]
        turns_before = [(sid, self._untrimmed_turns.get(sid)) for sid in turned]
        db.execute("BEGIN")
        try:
            for sid in deletes:
                delete(db, sid)
            insert_many(db, UPSERT_SESSION, saves)
            self._histories.write(db, saved)
            insert_many(db, INSERT_ENTRY, entries)
            insert_many(db, UPSERT_TURN, turns)
            for op in permissions:
                apply_permission(db, op)
            # trim a session's ledger every cap/8 entries (or max_bytes/8 bytes), not per
            # batch (replay reads only the newest entries that fit: the slack is invisible)
            cap, max_bytes = self._limits.ledger_max_entries, self._limits.ledger_max_bytes
            for sid, (added, added_bytes, added_largest, top) in appended.items():
                known = self._largest.get(sid)
                if known is not None and added_largest > known:
                    self._largest[sid] = known = added_largest
                pending = self._untrimmed.get(sid, 0) + added
                pending_bytes = self._untrimmed_bytes.get(sid, 0) + added_bytes
                if pending < max(1, cap // 8) and pending_bytes < max_bytes // 8:
                    self._untrimmed[sid] = pending
                    self._untrimmed_bytes[sid] = pending_bytes
                    continue
                self._untrimmed.pop(sid, None)
                self._untrimmed_bytes.pop(sid, None)
                self._trim_ledger(db, sid, top, added_largest)
            # turn records too, every TURN_TRIM_EVERY per session (reads take the newest)
            for sid, added in turned.items():
                pending = self._untrimmed_turns.get(sid, 0) + added
                if pending < TURN_TRIM_EVERY:
                    self._untrimmed_turns[sid] = pending
                    continue
                self._untrimmed_turns.pop(sid, None)
                db.execute(TRIM_TURNS, (sid, sid, TURNS_PER_SESSION))
            self._forget(db)
            db.execute("COMMIT")
        except BaseException:
            for sid, count, size in before:
                _put_back(self._untrimmed, sid, count)
                _put_back(self._untrimmed_bytes, sid, size)
            for sid, count in turns_before:
                _put_back(self._untrimmed_turns, sid, count)
            self._largest.clear()  # what the table holds is no longer known exactly
            self._histories.clear()
            with contextlib.suppress(sqlite3.Error):  # keep the original error
                db.execute("ROLLBACK")
            raise
        for op, exc in bad:
            dropped([op], exc, self.counters)


def _put_back(counts: dict[str, int], sid: str, count: int | None) -> None:
    """Restore one per-session counter to what it was (``None``: it was not there)."""
    if count is None:
        counts.pop(sid, None)
    else:
        counts[sid] = count
