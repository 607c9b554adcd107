"""SQLite session store: the embedded default (one file under the state dir, WAL).

All database work happens on one dedicated thread that owns the connection.
The event loop only puts operations on a queue (``save``/``append``/``delete``
cost a ``SimpleQueue.put``); the thread drains whatever is queued, applies it
in one transaction, and answers reads after the writes queued before them, so
a read always observes every earlier write. ``synchronous=NORMAL`` in WAL mode:
a committed batch survives a process crash (``kill -9``); an OS crash may lose
the last batch, never corrupt the file.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson

from xwm_bridge.store.base import (
    RUNNING,
    LedgerEntry,
    SessionQuery,
    SessionRecord,
    StoreError,
    StoreLimits,
    emitted_pos,
    recovered,
)

log = logging.getLogger("xwm_bridge.store")
T = TypeVar("T")
MAX_BATCH = 2048
#: how long queued writes wait to share one transaction; the durability window
#: of a ``kill -9``
GROUP_COMMIT_S = 0.01
CLOSE_TIMEOUT = 30.0
READ_TIMEOUT = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    history BLOB NOT NULL,
    seq INTEGER NOT NULL,
    last_turn_id TEXT NOT NULL,
    last_turn_status TEXT NOT NULL,
    upstream BLOB NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    turn_id TEXT NOT NULL,
    message BLOB NOT NULL,
    ts REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_session ON ledger (session_id, id);
CREATE INDEX IF NOT EXISTS ledger_ts ON ledger (ts);
"""

Op = tuple[Any, ...]
_STOP: Op = ("stop",)


def _row_to_record(row: tuple[Any, ...]) -> SessionRecord:
    sid, thread, provider, history, seq, turn_id, status, upstream, updated = row
    return SessionRecord(
        session_id=sid,
        thread_id=thread,
        provider=provider,
        history=tuple(orjson.loads(history)),
        seq=int(seq),
        last_turn_id=turn_id,
        last_turn_status=status,
        upstream=tuple((str(k), str(v)) for k, v in orjson.loads(upstream)),
        updated_at=float(updated),
    )


class SQLiteStore:
    name = "sqlite"

    def __init__(self, path: Path, limits: StoreLimits | None = None) -> None:
        self.path = path
        self._limits = limits or StoreLimits()
        self._ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready: Future[None] = Future()
        self._closed = False
        self._wake = threading.Event()
        #: ledger entries added per session since its last trim (store thread only)
        self._untrimmed: dict[str, int] = {}

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._thread = threading.Thread(target=self._run, name="sqlite-store", daemon=True)
            self._thread.start()
            await asyncio.wait_for(asyncio.wrap_future(self._ready), READ_TIMEOUT)
        except (OSError, sqlite3.Error, TimeoutError) as exc:
            raise StoreError(f"session store: cannot open {self.path}: {exc}") from None

    async def close(self) -> None:
        if self._thread is None or self._closed:
            return
        self._closed = True
        self._ops.put(_STOP)
        self._wake.set()
        thread = self._thread
        await asyncio.wait_for(asyncio.to_thread(thread.join), CLOSE_TIMEOUT)

    # --- writes (never block the loop) ---------------------------------------------------

    def save(self, record: SessionRecord) -> None:
        self._ops.put(("save", record))

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        self._ops.put(("append", session_id, entry))

    def delete(self, session_id: str) -> None:
        self._ops.put(("delete", session_id))

    # --- reads (run on the store thread after earlier writes) ----------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None or self._closed:
            raise RuntimeError("session store is not running")
        fut: Future[T] = Future()
        self._ops.put(("call", fn, fut))
        self._wake.set()
        return await asyncio.wait_for(asyncio.wrap_future(fut), READ_TIMEOUT)

    async def load(self, session_id: str) -> SessionRecord | None:
        def read(db: sqlite3.Connection) -> SessionRecord | None:
            row = db.execute(
                "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            record = _row_to_record(row)
            top = _ledger_seq(db, session_id)
            if top > record.seq:
                record = _with_seq(record, top)
            return record

        return await self._call(read)

    async def replay(
        self, session_id: str, after_seq: int, limit: int
    ) -> list[tuple[int, dict[str, Any]]]:
        horizon = time.time() - self._limits.ledger_max_age
        cap = self._limits.ledger_max_entries

        def read(db: sqlite3.Connection) -> list[tuple[int, dict[str, Any]]]:
            rows = db.execute(
                "SELECT pos, message FROM (SELECT id, pos, message, ts FROM ledger"
                " WHERE session_id = ? ORDER BY id DESC LIMIT ?)"
                " WHERE pos > ? AND ts >= ? ORDER BY id LIMIT ?",
                (session_id, cap, emitted_pos(after_seq), horizon, limit),
            ).fetchall()
            return [(int(r[0]), orjson.loads(r[1])) for r in rows]

        return await self._call(read)

    async def list_sessions(self, query: SessionQuery) -> list[SessionRecord]:
        def read(db: sqlite3.Connection) -> list[SessionRecord]:
            sql, args = "SELECT * FROM sessions", cast(tuple[Any, ...], ())
            if query.after is not None:
                at, sid = query.after
                sql += " WHERE updated_at < ? OR (updated_at = ? AND session_id < ?)"
                args = (at, at, sid)
            cursor = db.execute(sql + " ORDER BY updated_at DESC, session_id DESC", args)
            out: list[SessionRecord] = []
            while len(out) < query.limit:  # the upstream filter runs on decoded rows
                rows = cursor.fetchmany(256)
                if not rows:
                    break
                out += [r for r in map(_row_to_record, rows) if query.matches(r)]
            return out[: query.limit]

        return await self._call(read)

    async def recover(self) -> list[str]:
        def fix(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                "SELECT * FROM sessions WHERE last_turn_status = ?", (RUNNING,)
            ).fetchall()
            ids = []
            with db:
                for row in rows:
                    record = _row_to_record(row)
                    fixed, entry = recovered(record, _ledger_seq(db, record.session_id))
                    _upsert(db, fixed)
                    _insert_entry(db, record.session_id, entry)
                    ids.append(record.session_id)
            return ids

        return await self._call(fix)

    async def prune(self) -> int:
        now = time.time()

        def prune(db: sqlite3.Connection) -> int:
            with db:
                stale = [
                    r[0]
                    for r in db.execute(
                        "SELECT session_id FROM sessions WHERE updated_at < ?",
                        (now - self._limits.retention,),
                    )
                ]
                for sid in stale:
                    _delete(db, sid)
                db.execute("DELETE FROM ledger WHERE ts < ?", (now - self._limits.ledger_max_age,))
            return len(stale)

        return await self._call(prune)

    # --- the store thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(SCHEMA)
        except Exception as exc:  # reported to start()
            self._ready.set_exception(exc)
            return
        self._ready.set_result(None)
        try:
            self._serve(db)
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
                if op[0] in ("save", "append", "delete"):
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

    def _flush(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        if not writes:
            return
        try:
            self._apply(db, writes)
        except sqlite3.Error:
            log.exception("session store write failed", extra={"ops": len(writes)})
        writes.clear()

    def _apply(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        touched: dict[str, int] = {}
        live = _superseded(writes)
        db.execute("BEGIN")
        try:
            for i, op in enumerate(writes):
                if i not in live:
                    continue
                if op[0] == "save":
                    _upsert(db, op[1])
                elif op[0] == "append":
                    _insert_entry(db, op[1], op[2])
                    touched[op[1]] = touched.get(op[1], 0) + 1
                else:
                    _delete(db, op[1])
                    self._untrimmed.pop(op[1], None)
            # trim a session's ledger every cap/8 entries, not per batch (replay reads
            # only the newest `cap` entries, so the slack is never visible)
            cap = self._limits.ledger_max_entries
            for sid, added in touched.items():
                pending = self._untrimmed.get(sid, 0) + added
                if pending < max(1, cap // 8):
                    self._untrimmed[sid] = pending
                    continue
                self._untrimmed.pop(sid, None)
                db.execute(
                    "DELETE FROM ledger WHERE session_id = ? AND id <= (SELECT id FROM ledger"
                    " WHERE session_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (sid, sid, cap),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise


def _superseded(writes: list[Op]) -> set[int]:
    """Indexes of the writes that still matter: a save is dead when a later save or
    delete of the same session follows in the batch (a save replaces the whole row),
    a ledger append when a later delete does. Saves are typically two per turn (turn
    start and end) and a thread's next turn starts right after, so about half go."""
    live: set[int] = set()
    saved: set[str] = set()
    deleted: set[str] = set()
    for i in range(len(writes) - 1, -1, -1):
        op = writes[i]
        kind = op[0]
        if kind == "save":
            sid = op[1].session_id
            if sid not in saved and sid not in deleted:
                live.add(i)
            saved.add(sid)
        elif kind == "append":
            if op[1] not in deleted:
                live.add(i)
        else:
            live.add(i)
            deleted.add(op[1])
    return live


def _with_seq(record: SessionRecord, seq: int) -> SessionRecord:
    return replace(record, seq=seq)


def _ledger_seq(db: sqlite3.Connection, session_id: str) -> int:
    row = db.execute("SELECT MAX(pos) FROM ledger WHERE session_id = ?", (session_id,)).fetchone()
    return int(row[0]) // 2 if row and row[0] is not None else 0


def _upsert(db: sqlite3.Connection, r: SessionRecord) -> None:
    db.execute(
        "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            r.session_id,
            r.thread_id,
            r.provider,
            orjson.dumps(r.history),
            r.seq,
            r.last_turn_id,
            r.last_turn_status,
            orjson.dumps(r.upstream),
            r.updated_at,
        ),
    )


def _insert_entry(db: sqlite3.Connection, session_id: str, e: LedgerEntry) -> None:
    db.execute(
        "INSERT INTO ledger (session_id, pos, turn_id, message, ts) VALUES (?, ?, ?, ?, ?)",
        (session_id, e.pos, e.turn_id, orjson.dumps(e.message), e.ts),
    )


def _delete(db: sqlite3.Connection, session_id: str) -> None:
    db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM ledger WHERE session_id = ?", (session_id,))
