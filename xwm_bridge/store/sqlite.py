"""SQLite session store: the embedded default (one file under the state dir, WAL).

All database work happens on one dedicated thread that owns the connection.
The event loop only puts operations on a queue (``save``/``append``/``delete``
cost a ``SimpleQueue.put``); the thread drains whatever is queued, applies it
in one transaction, and answers reads after the writes queued before them, so
a read always observes every earlier write. ``synchronous=NORMAL`` in WAL mode:
a committed batch survives a process crash (``kill -9``); an OS crash may lose
the last batch, never corrupt the file.

The thread survives any bad record: a batch that fails is applied again one
write at a time, and only the writes that fail alone are dropped (logged and
counted). A thread found dead is started again by the next read or health probe.

The thread's work without the thread: ``sqlite_schema.py`` (tables, layout,
migrations), ``sqlite_writes.py`` (a batch's live writes, their rows and
statements), ``sqlite_rows.py`` (ledger rows, multi-row inserts, the replay
window) and ``sqlite_history.py`` (prompt rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import orjson

from xwm_bridge.store import sqlite_history
from xwm_bridge.store.base import (
    HEALTH_TIMEOUT,
    RUNNING,
    LedgerEntry,
    SessionRecord,
    StoreCounters,
    StoreError,
    StoreHealth,
    StoreLimits,
    WriteBacklog,
    interrupted_turn,
    recovered,
)
from xwm_bridge.store.records import (
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)
from xwm_bridge.store.sqlite_rows import batch_rows, insert_many, read_ledger
from xwm_bridge.store.sqlite_schema import SCHEMA, SCHEMA_VERSION, SESSION_COLUMNS, migrate
from xwm_bridge.store.sqlite_writes import (
    INSERT_ENTRY,
    LARGEST_ENTRY,
    TRIM_BYTES,
    TRIM_OLDER,
    TRIM_TURNS,
    UPSERT_SESSION,
    UPSERT_TURN,
    WRITES,
    Op,
    apply_permission,
    delete,
    insert_entry,
    ledger_top,
    live_writes,
    session_of,
    session_row,
    turn_row,
    upsert,
)

log = logging.getLogger("xwm_bridge.store")
T = TypeVar("T")
MAX_BATCH = 2048
#: how long queued writes wait to share one transaction; the durability window
#: of a ``kill -9``
GROUP_COMMIT_S = 0.01
CLOSE_TIMEOUT = 30.0
#: connection settings past WAL + synchronous=NORMAL (measured in performance.md):
#: statement journals (every multi-row INSERT and upsert inside the batch's
#: transaction) and sorts stay in memory instead of spilling to temp files (an
#: open, writes and an unlink per spill); a checkpoint every 4,000 WAL pages
#: (16 MiB at 4 KiB pages) instead of 1,000 copies a page rewritten by many
#: batches once, and fsyncs a quarter as often
TUNING = ("temp_store=MEMORY", "wal_autocheckpoint=4000")
READ_TIMEOUT = 30.0

#: turn rows over TURNS_PER_SESSION are deleted every this many inserts per session
#: (reads take the newest). A trim sorts the session's rows, about 40 µs here: every
#: 32 inserts it is about 1 µs per turn, every 8 it was 5
TURN_TRIM_EVERY = 32
_STOP: Op = ("stop",)

#: sessions whose trim counters (and largest entry) the store thread remembers; past
#: it, the oldest half is trimmed at once and forgotten (a daemon that sees a million
#: sessions keeps a few hundred KiB of counters, not a dict entry per session)
MAX_TRACKED_SESSIONS = 4096


def _row_to_record(db: sqlite3.Connection, row: tuple[Any, ...]) -> SessionRecord:
    """The record of a ``sessions`` row, its history read from ``history``."""
    sid, thread, provider, _, seq, turn_id, status, upstream, updated, events, owner = row[:11]
    start, end = int(row[11]), int(row[12])
    return SessionRecord(
        session_id=sid,
        thread_id=thread,
        provider=provider,
        history=sqlite_history.read(db, sid, start, end),
        prompts=end,
        seq=int(seq),
        last_turn_id=turn_id,
        last_turn_status=status,
        upstream=tuple((str(k), str(v)) for k, v in orjson.loads(upstream)),
        updated_at=float(updated),
        events=int(events),
        owner=owner,
    )


class SQLiteStore:
    name = "sqlite"

    def __init__(self, path: Path, limits: StoreLimits | None = None) -> None:
        self.path = path
        self._limits = limits or StoreLimits()
        self._ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self.backlog = WriteBacklog(self._ops.qsize, self.name)
        self._thread: threading.Thread | None = None
        self._ready: Future[None] = Future()
        self._closed = False
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
        #: the held ``<db>.lock`` (one process per database)
        self._lock_fd: int | None = None
        self.counters = StoreCounters()

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return lock_path(self.path)

    def _lock(self) -> None:
        """Hold ``<db>.lock`` for the life of the store: a second process on the same
        database would mark this one's running turns interrupted and fork its sessions."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            os.close(fd)
            raise StoreError(
                f"session store: {self.path} is in use by another xwm-bridge process"
                f"{f' (pid {holder})' if holder else ''}; run one process per state "
                "directory: give this one its own store.state_dir (XWM_STATE_DIR), or "
                "XWM_SESSION_STORE=memory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # releases the flock

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._start_thread()
            await asyncio.wait_for(asyncio.wrap_future(self._ready), READ_TIMEOUT)
        except (OSError, sqlite3.Error, TimeoutError) as exc:
            self._unlock()
            raise StoreError(f"session store: cannot open {self.path}: {exc}") from None

    def _start_thread(self) -> None:
        self._ready = Future()
        self._thread = threading.Thread(target=self._run, name="sqlite-store", daemon=True)
        self._thread.start()

    def _ensure_running(self) -> None:
        """Start the store thread again if it died (it should not: it catches everything)."""
        if self._closed or self._thread is None or self._thread.is_alive():
            return
        self.counters.restarts += 1
        log.error("session store thread had stopped; starting it again")
        self._start_thread()

    def alive(self) -> bool:
        thread = self._thread
        running = thread is not None and thread.is_alive() and not self._closed
        return running and not self.counters.last_error

    async def health(self, deadline_s: float = HEALTH_TIMEOUT) -> StoreHealth:
        if self._thread is None or self._closed:
            error = f"session store {self.path}: not running"
            return StoreHealth(self.name, "running", False, error)
        self._ensure_running()

        def probe(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO health (k, v) VALUES ('probe', ?)", (time.time(),))

        try:
            await asyncio.wait_for(self._call(probe), deadline_s)
        except TimeoutError:
            error = f"no answer from the store thread within {deadline_s:g}s"
            return StoreHealth(self.name, "writable", False, f"{self.path}: {error}")
        except Exception as exc:
            return StoreHealth(self.name, "writable", False, f"{self.path}: {exc}")
        self.counters.last_error = ""  # a write went through: the backend is back
        return StoreHealth(self.name, "writable", True)

    async def close(self) -> None:
        if self._thread is None or self._closed:
            self._unlock()
            return
        self._closed = True
        self._ops.put(_STOP)
        self._wake.set()
        thread = self._thread
        try:
            await asyncio.wait_for(asyncio.to_thread(thread.join), CLOSE_TIMEOUT)
        finally:
            self._unlock()

    # --- writes (never block the loop) ---------------------------------------------------

    async def writable(self) -> None:
        await self.backlog.writable()

    def save(self, record: SessionRecord) -> None:
        self._ops.put(("save", record))

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        self._ops.put(("append", session_id, entry))

    def append_many(self, session_id: str, entries: Sequence[LedgerEntry]) -> None:
        self._ops.put(("append", session_id, tuple(entries)))  # one row where they run on

    def delete(self, session_id: str) -> None:
        self._ops.put(("delete", session_id))

    def save_turn(self, record: TurnRecord) -> None:
        self._ops.put(("turn", record))

    def save_permission(self, record: PermissionRecord) -> None:
        self._ops.put(("perm", record))

    def delete_permission(self, session_id: str, request_id: str) -> None:
        self._ops.put(("unperm", session_id, request_id))

    # --- reads (run on the store thread after earlier writes) ----------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None or self._closed:
            raise RuntimeError("session store is not running")
        self._ensure_running()
        fut: Future[T] = Future()
        self._ops.put(("call", fn, fut))
        self._wake.set()
        return await asyncio.wait_for(asyncio.wrap_future(fut), READ_TIMEOUT)

    async def load(self, session_id: str) -> SessionRecord | None:
        def read(db: sqlite3.Connection) -> SessionRecord | None:
            row = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            record = _row_to_record(db, row)
            top, events = ledger_top(db, session_id)
            if top > record.seq or events > record.events:
                record = replace(
                    record, seq=max(top, record.seq), events=max(events, record.events)
                )
            return record

        return await self._call(read)

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        horizon = time.time() - self._limits.ledger_max_age
        cap, max_bytes = self._limits.ledger_max_entries, self._limits.ledger_max_bytes

        def read(db: sqlite3.Connection) -> list[LedgerEntry]:
            entries = read_ledger(db, session_id, after_seq, after_event, horizon, cap, max_bytes)
            return entries[:limit]

        return await self._call(read)

    async def recover(self) -> list[str]:
        def fix(db: sqlite3.Connection) -> list[str]:
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE last_turn_status = ?", (RUNNING,)
            ).fetchall()
            ids = []
            with db:
                db.execute("DELETE FROM permissions")  # their turns died with the process
                for row in rows:
                    record = _row_to_record(db, row)
                    fixed, entry = recovered(record, *ledger_top(db, record.session_id))
                    upsert(db, fixed)
                    insert_entry(db, record.session_id, entry)
                    body = db.execute(
                        "SELECT body FROM turns WHERE session_id = ? AND turn_id = ?",
                        (record.session_id, record.last_turn_id),
                    ).fetchone()
                    stored = TurnRecord.loads(body[0]) if body else None
                    db.execute(UPSERT_TURN, turn_row(interrupted_turn(record, stored)))
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
                    delete(db, sid)
                    self._histories.forget(sid)
                db.execute("DELETE FROM ledger WHERE ts < ?", (now - self._limits.ledger_max_age,))
                db.execute(
                    "DELETE FROM turns WHERE session_id NOT IN (SELECT session_id FROM sessions)"
                )
            return len(stale)

        return await self._call(prune)

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        def read(db: sqlite3.Connection) -> list[TurnRecord]:
            rows = db.execute(
                "SELECT body FROM turns WHERE session_id = ?"
                " ORDER BY started_at DESC, turn_id DESC LIMIT ?",
                (session_id, min(max(0, limit), TURNS_PER_SESSION)),  # rows trim lazily
            ).fetchall()
            return [TurnRecord.loads(r[0]) for r in reversed(rows)]

        return await self._call(read)

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if query.state == "idle":
            where.append("s.last_turn_status != 'running'")
        elif query.state:
            where.append("s.last_turn_status = ?")
            args.append(query.state)
        for column, value in (("s.provider", query.provider), ("s.thread_id", query.thread_id)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)
        if query.updated_since:
            where.append("s.updated_at >= ?")
            args.append(query.updated_since)
        if query.owner is not None:  # unowned sessions (from before owners) are anyone's
            where.append("s.owner IN ('', ?)")
            args.append(query.owner)
        if query.after is not None:
            where.append("(s.updated_at < ? OR (s.updated_at = ? AND s.session_id < ?))")
            args += [query.after[0], query.after[0], query.after[1]]
        for key, wanted in query.upstream:  # the upstream ids: a JSON list of [key, value]
            pair = "json_extract(j.value, '$[0]') = ?"
            args.append(key)
            if wanted is not None:
                pair += " AND json_extract(j.value, '$[1]') = ?"
                args.append(wanted)
            where.append(
                f"EXISTS (SELECT 1 FROM json_each(CAST(s.upstream AS TEXT)) j WHERE {pair})"
            )
        sql = (
            f"SELECT {', '.join('s.' + c.strip() for c in SESSION_COLUMNS.split(','))}, t.body"
            " FROM sessions s LEFT JOIN turns t"
            " ON t.session_id = s.session_id AND t.turn_id = s.last_turn_id"
            f" WHERE {' AND '.join(where)}"
            " ORDER BY s.updated_at DESC, s.session_id DESC LIMIT ?"
        )
        args.append(query.limit + 1)

        def read(db: sqlite3.Connection) -> SessionPage:
            rows = db.execute(sql, args).fetchall()
            items = [
                (_row_to_record(db, r[:-1]), TurnRecord.loads(r[-1]) if r[-1] else None)
                for r in rows[: query.limit]
            ]
            more = len(rows) > query.limit and items
            last = items[-1][0] if more else None
            return SessionPage(items, (last.updated_at, last.session_id) if last else None)

        return await self._call(read)

    async def permissions(self) -> list[PermissionRecord]:
        def read(db: sqlite3.Connection) -> list[PermissionRecord]:
            rows = db.execute(
                "SELECT body FROM permissions ORDER BY created_at, request_id"
            ).fetchall()
            return [PermissionRecord.loads(r[0]) for r in rows]

        return await self._call(read)

    # --- the store thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            for pragma in TUNING:
                db.execute(f"PRAGMA {pragma}")
            migrate(db)
            db.executescript(SCHEMA + sqlite_history.SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
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
            if isinstance(exc, sqlite3.OperationalError) or len(writes) == 1:
                self._dropped(writes, exc)  # the backend refuses: retrying alone won't help
            else:
                self._isolate(db, writes)
        else:
            self.counters.last_error = ""
        writes.clear()

    def _trim_ledger(self, db: sqlite3.Connection, sid: str, top: int, added_largest: int) -> None:
        """Bring a session's ledger rows to its bounds (in the caller's transaction).
        ``top``: its newest event id if known (else 0); ``added_largest``: the largest
        entry just appended."""
        cap, max_bytes = self._limits.ledger_max_entries, self._limits.ledger_max_bytes
        db.execute(  # the newest `cap` rows hold at least `cap` entries
            "DELETE FROM ledger WHERE session_id = ? AND id <= (SELECT id FROM ledger"
            " WHERE session_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
            (sid, sid, cap),
        )
        if top > cap:  # rows whose entries are all older than the newest `cap`
            db.execute(TRIM_OLDER, (sid, sid, top - cap + 1))
        known = self._largest.get(sid)
        biggest = max(known or 0, added_largest)
        if known is None or cap * biggest > max_bytes:
            # the window query reads every entry of the session: only when the count
            # bound alone may not keep the byte bound
            db.execute(TRIM_BYTES, (sid, sid, max_bytes))
            row = db.execute(LARGEST_ENTRY, (sid,)).fetchone()
            biggest = int(row[0] or 0)  # of the entries left
        self._largest[sid] = biggest

    def _forget(self, db: sqlite3.Connection) -> None:
        """Keep the per-session counters bounded (:data:`MAX_TRACKED_SESSIONS`): the
        oldest half of the tracked sessions is trimmed now and forgotten."""
        if len(self._untrimmed) > MAX_TRACKED_SESSIONS:
            for sid in list(itertools.islice(self._untrimmed, len(self._untrimmed) // 2)):
                del self._untrimmed[sid]
                self._untrimmed_bytes.pop(sid, None)
                self._trim_ledger(db, sid, 0, 0)
        if len(self._untrimmed_turns) > MAX_TRACKED_SESSIONS:
            half = len(self._untrimmed_turns) // 2
            for sid in list(itertools.islice(self._untrimmed_turns, half)):
                del self._untrimmed_turns[sid]
                db.execute(TRIM_TURNS, (sid, sid, TURNS_PER_SESSION))
        if len(self._largest) > MAX_TRACKED_SESSIONS:  # forgotten: one full trim next time
            for sid in list(itertools.islice(self._largest, len(self._largest) // 2)):
                del self._largest[sid]

    @staticmethod
    def _rows(
        session_id: str,
        payload: LedgerEntry | tuple[LedgerEntry, ...],
        bad: list[tuple[Op, Exception]],
    ) -> list[tuple[tuple[Any, ...], list[int]]]:
        """The ledger rows of one ``append`` op; an entry that cannot be encoded is
        left out and added to ``bad`` (the others are kept)."""
        encoded: list[tuple[LedgerEntry, bytes]] = []
        for entry in payload if isinstance(payload, tuple) else (payload,):
            try:
                encoded.append((entry, orjson.dumps(entry.message)))
            except TypeError as exc:  # e.g. nested deeper than orjson writes
                bad.append((("append", session_id, entry), exc))
        return batch_rows(session_id, encoded) if encoded else []

    def _isolate(self, db: sqlite3.Connection, writes: list[Op]) -> None:
        """A batch failed on a bad record: apply its writes one by one, drop the bad."""
        for op in writes:
            try:
                self._apply(db, [op])
            except Exception as exc:
                self._dropped([op], exc)

    def _dropped(self, ops: list[Op], exc: Exception) -> None:
        backend = isinstance(exc, sqlite3.OperationalError)
        if backend:
            self.counters.write_errors += len(ops)
            self.counters.last_error = str(exc)[:300]
        else:
            self.counters.bad_records += len(ops)
        log.error(
            "session store write failed; dropped" if backend else "session store dropped a record",
            extra={
                "ops": len(ops),
                "op": ops[0][0],
                "session_id": session_of(ops[0])[:128],
                "error": f"{type(exc).__name__}: {exc}"[:300],
            },
        )

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
        touched: dict[str, int] = {}
        sizes: dict[str, int] = {}
        largest: dict[str, int] = {}
        tops: dict[str, int] = {}  # the newest event id appended per session
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
                sid = op[1]
                for row, entry_sizes in self._rows(sid, op[2], bad):
                    entries.append(row)
                    touched[sid] = touched.get(sid, 0) + len(entry_sizes)
                    sizes[sid] = sizes.get(sid, 0) + sum(entry_sizes)
                    size = max(entry_sizes)  # of one entry, as the byte bound counts it
                    if size > largest.get(sid, 0):
                        largest[sid] = size
                    top = row[5] + row[7] - 1
                    if top > tops.get(sid, 0):
                        tops[sid] = top
            elif kind == "turn":
                turns.append(turn_row(op[1]))
                turned[op[1].session_id] = turned.get(op[1].session_id, 0) + 1
            elif kind == "delete":
                deletes.append(op[1])
                self._untrimmed.pop(op[1], None)
                self._untrimmed_bytes.pop(op[1], None)
                self._untrimmed_turns.pop(op[1], None)
                self._largest.pop(op[1], None)
                self._histories.forget(op[1])
            else:
                permissions.append(op)  # in their order: a request's save, then its delete
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
            for sid, added in touched.items():
                known = self._largest.get(sid)
                if known is not None and largest.get(sid, 0) > known:
                    self._largest[sid] = known = largest[sid]
                pending = self._untrimmed.get(sid, 0) + added
                pending_bytes = self._untrimmed_bytes.get(sid, 0) + sizes[sid]
                if pending < max(1, cap // 8) and pending_bytes < max_bytes // 8:
                    self._untrimmed[sid] = pending
                    self._untrimmed_bytes[sid] = pending_bytes
                    continue
                self._untrimmed.pop(sid, None)
                self._untrimmed_bytes.pop(sid, None)
                self._trim_ledger(db, sid, tops.get(sid, 0), largest.get(sid, 0))
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
            self._largest.clear()  # what the table holds is no longer known exactly
            self._histories.clear()
            with contextlib.suppress(sqlite3.Error):  # keep the original error
                db.execute("ROLLBACK")
            raise
        for op, exc in bad:
            self._dropped([op], exc)


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def lock_holder(fd: int) -> str:
    """The pid written in a lock file (may be stale or empty)."""
    with contextlib.suppress(OSError, ValueError):
        return os.pread(fd, 32, 0).decode().strip()
    return ""
