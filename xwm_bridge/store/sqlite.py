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

This module holds the store's lifecycle (the lock, start, health, close), its
queued writes and its reads; ``sqlite_thread.py`` the thread itself (its loop,
group commit, batches, the per-session trims; :class:`StoreThread` is the base of
:class:`SQLiteStore`). The thread's work without the thread: ``sqlite_schema.py``
(tables, layout, migrations), ``sqlite_writes.py`` (a batch's live writes, their rows and
statements), ``sqlite_rows.py`` (ledger rows, multi-row inserts, the replay
window), ``sqlite_history.py`` (prompt rows), ``sqlite_reads.py`` (the reads, as
functions of a connection) and ``sqlite_lock.py`` (the one-process ``<db>.lock``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from xwm_bridge.store import sqlite_lock, sqlite_reads
from xwm_bridge.store.base import (
    HEALTH_TIMEOUT,
    LedgerEntry,
    SessionRecord,
    StoreError,
    StoreHealth,
    StoreLimits,
    StoreUnavailable,
    WriteBacklog,
)
from xwm_bridge.store.records import PermissionRecord, SessionPage, SessionQuery, TurnRecord
from xwm_bridge.store.sqlite_lock import lock_path
from xwm_bridge.store.sqlite_thread import STOP, StoreThread
from xwm_bridge.store.sqlite_writes import refused
from xwm_bridge.tasks import thread_done, wait_for

log = logging.getLogger("xwm_bridge.store")
T = TypeVar("T")
CLOSE_TIMEOUT = 30.0
READ_TIMEOUT = 30.0


class SQLiteStore(StoreThread):
    name = "sqlite"

    def __init__(self, path: Path, limits: StoreLimits | None = None) -> None:
        super().__init__(path, limits or StoreLimits())  # the thread's state
        self.backlog = WriteBacklog(self._ops.qsize, self.name)
        self._thread: threading.Thread | None = None
        self._closed = False
        #: the held ``<db>.lock`` (one process per database)
        self._lock_fd: int | None = None

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
                self._ops.put(STOP)
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
        self._ops.put(STOP)
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
