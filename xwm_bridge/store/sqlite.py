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
window), ``sqlite_history.py`` (prompt rows), ``sqlite_reads.py`` (the reads, as
functions of a connection) and ``sqlite_lock.py`` (the one-process ``<db>.lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from xwm_bridge.store import sqlite_history, sqlite_lock, sqlite_reads
from xwm_bridge.store.base import (
    HEALTH_TIMEOUT,
    LedgerEntry,
    SessionRecord,
    StoreCounters,
    StoreError,
    StoreHealth,
    StoreLimits,
    StoreUnavailable,
    WriteBacklog,
)
from xwm_bridge.store.records import (
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)
from xwm_bridge.store.sqlite_lock import lock_holder as lock_holder  # re-exported
from xwm_bridge.store.sqlite_lock import lock_path
from xwm_bridge.store.sqlite_rows import insert_many
from xwm_bridge.store.sqlite_schema import SCHEMA as SCHEMA  # re-exported
from xwm_bridge.store.sqlite_schema import SCHEMA_VERSION as SCHEMA_VERSION  # re-exported
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
from xwm_bridge.tasks import thread_done, wait_for

log = logging.getLogger("xwm_bridge.store")
T = TypeVar("T")
MAX_BATCH = 2048
#: how long queued writes wait to share one transaction; the durability window
#: of a ``kill -9``
GROUP_COMMIT_S = 0.01
CLOSE_TIMEOUT = 30.0
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


class SQLiteStore:
    name = "sqlite"

    def __init__(self, path: Path, limits: StoreLimits | None = None) -> None:
        self.path = path
        self._limits = limits or StoreLimits()
        self._ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self.backlog = WriteBacklog(self._ops.qsize, self.name)
        self._thread: threading.Thread | None = None
        self._ready: Future[None] = Future()
        #: set by the store thread as it ends (close() waits for it)
        self._stopped: Future[None] = Future()
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
        """Hold ``<db>.lock`` for the life of the store (:func:`sqlite_lock.acquire`)."""
        self._lock_fd = sqlite_lock.acquire(self.path)

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            sqlite_lock.release(fd)

    async def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock()
            self._start_thread()
            await wait_for(asyncio.wrap_future(self._ready), READ_TIMEOUT)
        except (OSError, sqlite3.Error, TimeoutError) as exc:
            if self._thread is None:  # the directory or the lock failed
                self._unlock()
            else:  # a thread still opening stops once open: it releases the lock as it ends
                self._closed = True
                self._ops.put(_STOP)
                if not isinstance(exc, TimeoutError):  # it failed to open: it is ending
                    await thread_done(self._stopped, CLOSE_TIMEOUT)
                self._stopped.add_done_callback(lambda _: self._unlock())
            raise StoreError(f"session store: cannot open {self.path}: {exc}") from None

    def _start_thread(self) -> None:
        self._ready, self._stopped = Future(), Future()
        self._thread = threading.Thread(
            target=self._run, args=(self._stopped,), name="sqlite-store", daemon=True
        )
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
            await wait_for(self._call(probe), deadline_s)
        except TimeoutError:
            error = f"no answer from the store thread within {deadline_s:g}s"
            return StoreHealth(self.name, "writable", False, f"{self.path}: {error}")
        except StoreUnavailable as exc:  # its message names the file
            return StoreHealth(self.name, "writable", False, str(exc))
        except Exception as exc:
            return StoreHealth(self.name, "writable", False, f"{self.path}: {exc}")
        if recent := self.counters.probe_passed():
            return StoreHealth(
                self.name, "writable", False, f"{self.path}: writes failing: {recent}"
            )
        return StoreHealth(self.name, "writable", True)

    async def close(self) -> None:
        """Apply every queued write and stop the thread within :data:`CLOSE_TIMEOUT`; a
        thread busy past it (a statement that does not return) is left to run, a daemon:
        logged, and the lock is held until it ends (it may still write)."""
        if self._closed:
            return
        if self._thread is None:
            self._unlock()
            return
        self._closed = True
        self._ops.put(_STOP)
        self._wake.set()
        stopped = self._stopped
        try:
            if not await thread_done(stopped, CLOSE_TIMEOUT):
                log.error(
                    "session store thread did not stop: writes queued are not applied;"
                    " the lock is held until it ends",
                    extra={"path": str(self.path), "waited_s": CLOSE_TIMEOUT},
                )
        finally:  # at once if the thread has ended, else by the thread as it ends
            stopped.add_done_callback(lambda _: self._unlock())

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
        try:
            return await wait_for(asyncio.wrap_future(fut), READ_TIMEOUT)
        except TimeoutError:
            raise StoreUnavailable(
                f"session store {self.path}: no answer from the store thread within "
                f"{READ_TIMEOUT:g}s"
            ) from None
        except sqlite3.DatabaseError as exc:  # locked, disk I/O error, read-only, damaged
            if not refused(exc):
                raise  # no such table, IntegrityError…: a bug, with its traceback
            raise StoreUnavailable(f"session store {self.path}: {exc}") from None

    async def load(self, session_id: str) -> SessionRecord | None:
        return await self._call(lambda db: sqlite_reads.record(db, session_id))

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        horizon = time.time() - self._limits.ledger_max_age
        cap, max_bytes = self._limits.ledger_max_entries, self._limits.ledger_max_bytes
        return await self._call(
            lambda db: sqlite_reads.ledger(
                db, session_id, after_seq, limit, after_event, horizon, cap, max_bytes
            )
        )

    async def recover(self) -> list[str]:
        return await self._call(sqlite_reads.recover)

    async def prune(self) -> int:
        now = time.time()
        forget = self._forget_session
        return await self._call(lambda db: sqlite_reads.prune(db, now, self._limits, forget))

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        return await self._call(lambda db: sqlite_reads.turns(db, session_id, limit))

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        sql, args = sqlite_reads.session_sql(query)
        return await self._call(lambda db: sqlite_reads.session_page(db, sql, args, query.limit))

    async def permissions(self) -> list[PermissionRecord]:
        return await self._call(sqlite_reads.permissions)

    # --- the store thread ------------------------------------------------------------------

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
                for row, entry_sizes in append_rows(sid, op[2], bad):
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
                self._forget_session(op[1])
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
            dropped([op], exc, self.counters)
