"""Redis session store: the shared store of several replicas (issue 6).

Same contract as the SQLite store. One task owns the ordering: writes are
queued without blocking and sent in pipelined batches; a read is queued like a
write and runs after every write queued before it (it may also see writes
queued just after it, in the same batch).

Records and ledgers expire after ``retention`` (refreshed on every write; a running
session's record not until its turn ends), so retention costs nothing. A turn left
``running`` whose owner's liveness key has expired is recovered as interrupted by any
replica.

This module holds the store's lifecycle (start, health, heartbeats, close), its
queued writes and its reads; ``redis_writer.py`` the writer task itself (its loop
and batches; :class:`WriterTask` is the base of :class:`RedisStore`). The writer
task's work without the task: ``redis_schema.py`` (the key layout, its
version and migration, the record and entry encodings), ``redis_writes.py`` (the
Lua scripts and pipeline commands of a batch's writes) and ``redis_reads.py`` (the
reads, as functions of a connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis

from xwm_bridge.store import redis_client, redis_reads, redis_schema
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
from xwm_bridge.store.records import PermissionRecord, SessionPage, SessionQuery, TurnRecord
from xwm_bridge.store.redis_schema import from_hash, text
from xwm_bridge.store.redis_writer import Call, WriterTask
from xwm_bridge.store.redis_writes import TRIM_INDEX, Commands, Op
from xwm_bridge.tasks import stop, wait_for

log = logging.getLogger("xwm_bridge.store")
#: index entries one prune script call looks at
TRIM_INDEX_BATCH = 1000
#: looks at one running session a recovery makes when other writes to it keep coming
#: between its read and its transaction (``WatchError``); the next prune looks again
RECOVER_ATTEMPTS = 3


class RedisStore(WriterTask):
    name = "redis"

    def __init__(
        self,
        url: str,
        limits: StoreLimits | None = None,
        *,
        prefix: str = "xwm:",
        lease_ttl: float = 10.0,
        timeout: float = 5.0,
        replica_id: str = "",
    ) -> None:
        self._limits = limits or StoreLimits()
        self.prefix = prefix
        self.lease_ttl = lease_ttl
        self.timeout = timeout
        self.replica_id = replica_id or uuid.uuid4().hex[:12]
        parts = urlsplit(url)
        self._where = f"{parts.hostname}:{parts.port or 6379}"  # never the password
        self.client: aioredis.Redis = redis_client.connect(url, timeout)
        self._ops: asyncio.Queue[Op] = asyncio.Queue()
        self.backlog = WriteBacklog(self._ops.qsize, self.name)
        #: thread id → fencing token of the turn this replica runs on it (cluster.py)
        self.fences: dict[str, int] = {}
        self._writer: asyncio.Task[None] | None = None
        #: the writer task's batch not sent yet (what a close that gives up leaves unsent)
        self._current: list[Op] = []
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        self.counters = StoreCounters()
        self._commands = Commands(prefix, self._limits, self.replica_id, self._dropped)

    def key(self, kind: str, name: str = "") -> str:
        return redis_schema.key(self.prefix, kind, name)

    @property
    def retention(self) -> float:
        """``store.retention``: how long a record outlives its last write."""
        return self._limits.retention

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await wait_for(self.client.ping(), self.timeout)
            await self._beat()
            await wait_for(self.migrate(), self.timeout * 12)
        except (OSError, TimeoutError, aioredis.RedisError) as exc:
            await self.client.aclose()
            raise StoreError(f"session store: cannot reach Redis at {self._where}: {exc}") from None
        loop = asyncio.get_running_loop()
        self._writer = loop.create_task(self._serve(), name="redis-store")
        self._heartbeat = loop.create_task(self._heartbeats(), name="redis-heartbeat")

    def alive(self) -> bool:
        writer = self._writer
        running = writer is not None and not writer.done() and not self._closed
        return running and not self.counters.last_error

    def _ensure_running(self) -> None:
        """Start the writer task again if it ended (it should not: it catches everything)."""
        if self._closed or self._writer is None or not self._writer.done():
            return
        self.counters.restarts += 1
        log.error("session store writer had stopped; starting it again")
        self._writer = asyncio.get_running_loop().create_task(self._serve(), name="redis-store")

    async def health(self, deadline_s: float = HEALTH_TIMEOUT) -> StoreHealth:
        """A probe key written (it expires) within ``deadline_s``: Redis is reachable and
        takes writes. A writer task found ended is started again first."""
        if self._writer is None or self._closed:
            error = f"session store: Redis at {self._where}: not running"
            return StoreHealth(self.name, "running", False, error)
        self._ensure_running()
        wait = min(self.timeout, deadline_s)
        try:
            await wait_for(
                self.client.set(self.key("health", self.replica_id), b"1", px=60_000), wait
            )
        except (OSError, TimeoutError, aioredis.ConnectionError, aioredis.TimeoutError) as exc:
            error = f"Redis at {self._where}: {exc or f'no answer within {wait:g}s'}"
            return StoreHealth(self.name, "reachable", False, error)
        except Exception as exc:  # it answers, but refuses the write (OOM, read-only replica)
            return StoreHealth(self.name, "writable", False, f"Redis at {self._where}: {exc}")
        if recent := self.counters.probe_passed():
            error = f"Redis at {self._where}: writes failing: {recent}"
            return StoreHealth(self.name, "writable", False, error)
        return StoreHealth(self.name, "reachable", True, detail=f"redis {self._where}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._ops.put_nowait(("stop",))
            with contextlib.suppress(Exception):  # TimeoutError: the writer is cancelled
                await wait_for(self._writer, self.timeout * 2)
            self._drop_unsent()
        if self._heartbeat is not None:  # a beat in flight ends within the timeout
            await stop(self._heartbeat, self.timeout + 1)
        with contextlib.suppress(Exception):
            await wait_for(self.client.delete(self.key("replica", self.replica_id)), 1)
        await self.client.aclose()

    async def _beat(self) -> None:
        ms = int(self.lease_ttl * 1000)
        await wait_for(
            self.client.set(self.key("replica", self.replica_id), b"1", px=ms), self.timeout
        )

    async def _heartbeats(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self._beat()
            except Exception as exc:  # Redis away: turns go on; liveness resumes with it
                log.warning("replica heartbeat failed", extra={"error": repr(exc)})

    async def migrate(self) -> int:
        """Bring ledgers of an earlier layout to the current one (``redis_schema.migrate``);
        how many were rewritten."""
        return await redis_schema.migrate(self.client, self.prefix)

    async def replica_alive(self, replica_id: str) -> bool:
        return bool(await self.client.exists(self.key("replica", replica_id)))

    # --- writes (never block the loop) ---------------------------------------------------

    async def writable(self) -> None:
        await self.backlog.writable()

    def save(self, record: SessionRecord) -> None:
        self._ops.put_nowait(("save", record, self.fences.get(record.thread_id, 0)))

    def append(self, session_id: str, entry: LedgerEntry) -> None:
        self._ops.put_nowait(("append", session_id, entry))

    def append_many(self, session_id: str, entries: Sequence[LedgerEntry]) -> None:
        for entry in entries:
            self._ops.put_nowait(("append", session_id, entry))

    def delete(self, session_id: str) -> None:
        self._ops.put_nowait(("delete", session_id))

    def save_turn(self, record: TurnRecord) -> None:
        self._ops.put_nowait(("turn", record))

    def save_permission(self, record: PermissionRecord) -> None:
        self._ops.put_nowait(("perm", replace(record, owner=self.replica_id)))

    def delete_permission(self, session_id: str, request_id: str) -> None:
        self._ops.put_nowait(("unperm", session_id, request_id))

    # --- reads, ordered after earlier writes ----------------------------------------------

    async def _call(self, fn: Call) -> Any:
        if self._writer is None or self._closed:
            raise RuntimeError("session store is not running")
        self._ensure_running()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._ops.put_nowait(("call", fn, fut))
        try:
            return await wait_for(fut, self.timeout * 3)
        except Exception as exc:
            raise self.outage(exc, self.timeout * 3) from None

    def outage(self, exc: Exception, waited: float) -> Exception:
        """What a request raises for ``exc`` (after ``waited`` s): ``StoreUnavailable``
        for Redis away, too slow or refusing to serve (READONLY, OOM, MASTERDOWN…, the
        reply's class named); any other error (WRONGTYPE, ERR …) is a bug, raised as is
        (its traceback logged by the dispatcher)."""
        return redis_client.outage(exc, self._where, waited) or exc

    async def flush(self) -> None:
        """Wait until every write queued so far has reached Redis."""

        async def noop(_: aioredis.Redis) -> None:
            return None

        await self._call(noop)

    async def load(self, session_id: str) -> SessionRecord | None:
        result: SessionRecord | None = await self._call(
            lambda db: redis_reads.record(db, self.prefix, session_id)
        )
        return result

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        horizon = time.time() - self._limits.ledger_max_age
        result: list[LedgerEntry] = await self._call(
            lambda db: redis_reads.ledger(
                db, self.prefix, session_id, after_seq, limit, after_event, horizon
            )
        )
        return result

    async def recover(self) -> list[str]:
        """At start: interrupt ``running`` turns whose owner replica is gone."""
        return await self._recover(skip_own=False)

    async def _recover(self, *, skip_own: bool) -> list[str]:

        async def fix(db: aioredis.Redis) -> list[str]:
            ids: list[str] = []
            for raw in await db.smembers(self.key("running")):
                sid = text(raw)
                for _ in range(RECOVER_ATTEMPTS):
                    try:
                        if await fix_one(db, sid):
                            ids.append(sid)
                        break
                    except aioredis.WatchError:  # written meanwhile: look at it again
                        continue
            return ids

        async def fix_one(db: aioredis.Redis, sid: str) -> bool:
            """Interrupt ``sid``'s running turn if its owner is gone, under ``WATCH`` of
            its record (which every save and append of the session writes): another
            replica recovering it too, or starting a new turn on it, in between fails
            the transaction (``WatchError``), and the caller looks again."""
            skey = self.key("s", sid)
            async with db.pipeline(transaction=True) as pipe:
                await pipe.watch(skey)
                h = await pipe.hgetall(skey)
                if not h:
                    await db.srem(self.key("running"), sid)
                    return False
                owner = text(h.get(b"owner"))
                if owner == self.replica_id:
                    if skip_own:
                        return False
                elif owner and await self.replica_alive(owner):
                    return False
                record = from_hash(sid, h)
                if record.last_turn_status != RUNNING:
                    await db.srem(self.key("running"), sid)
                    return False
                top = await redis_reads.ledger_top(pipe, self.prefix, sid)
                fixed, entry = recovered(record, *top)
                stored = await redis_reads.last_turn(pipe, self.prefix, record)
                pipe.multi()  # type: ignore[no-untyped-call]
                self._commands.save(pipe, fixed)
                self._commands.append(pipe, sid, [entry])
                self._commands.operator(pipe, ("turn", interrupted_turn(record, stored)))
                await pipe.execute()
                return True

        result: list[str] = await self._call(fix)
        return result

    async def recover_orphans(self) -> list[str]:
        """Interrupt ``running`` turns of replicas that died (never this one's)."""
        return await self._recover(skip_own=True)

    async def prune(self) -> int:
        """Retention is key expiry; here only turns orphaned by dead replicas and the
        session index's expired entries."""
        await self.recover_orphans()
        horizon = time.time() - self._limits.retention

        async def trim(db: aioredis.Redis) -> None:
            keys, offset = (self.key("idx"), self.key("running")), 0
            while True:  # in batches: one script call never holds Redis for long
                looked, kept = await db.eval(
                    TRIM_INDEX, 2, *keys, horizon, TRIM_INDEX_BATCH, offset
                )
                offset += int(kept)
                if int(looked) < TRIM_INDEX_BATCH:
                    return

        await self._call(trim)
        return 0

    # --- operator views (issue 13) ---------------------------------------------------------

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        result: list[TurnRecord] = await self._call(
            lambda db: redis_reads.turns(db, self.prefix, session_id)
        )
        return result[-limit:] if limit > 0 else []

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        result: SessionPage = await self._call(
            lambda db: redis_reads.session_page(db, self.prefix, query)
        )
        return result

    async def permissions(self) -> list[PermissionRecord]:
        async def read(db: aioredis.Redis) -> tuple[list[PermissionRecord], dict[str, bool]]:
            # the owners' liveness in the same read: an outage is StoreUnavailable
            found = await redis_reads.permissions(db, self.prefix)
            alive: dict[str, bool] = {self.replica_id: True, "": False}
            for p in found:
                if p.owner not in alive:
                    alive[p.owner] = bool(await db.exists(self.key("replica", p.owner)))
            return found, alive

        found, alive = await self._call(read)
        pending = []
        for p in found:
            if alive[p.owner]:
                pending.append(p)
            else:  # its replica died: so did its turn
                self.delete_permission(p.session_id, p.request_id)
        return sorted(pending, key=lambda p: (p.created_at, p.request_id))
