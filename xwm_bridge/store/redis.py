"""Redis session store: the shared store of several replicas (issue 6).

Same contract as the SQLite store. One task owns the ordering: writes are
queued without blocking and sent in pipelined batches; a read is queued like a
write and runs after every write queued before it (it may also see writes
queued just after it, in the same batch). Keys (``prefix`` first):

* ``s:<sid>``  hash — the record, plus ``owner``: the replica running its turn
* ``l:<sid>``  list — ledger entries (JSON ``{p, e, k, t, ts, m}``: seq position, event
  id, kind, turn, time, message), trimmed to the cap
* ``schema``   the key layout's version (:data:`SCHEMA_VERSION`)
* ``running``  set  — sessions whose last turn is ``running``
* ``replica:<id>`` — a replica's liveness key, refreshed every ``lease_ttl / 3``

Records and ledgers expire after ``retention`` (refreshed on every write), so
retention costs nothing. A turn left ``running`` whose owner's liveness key
has expired is recovered as interrupted by any replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import redis.asyncio as aioredis

from xwm_bridge.store.base import (
    HEALTH_TIMEOUT,
    NOTIFICATION,
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
T = TypeVar("T")
MAX_BATCH = 1024
Op = tuple[Any, ...]
# KEYS: fence, record, running, index; ARGV: token (0 = unfenced), expire-at ms, session
# id, running 0/1, updated-at (the index score), fields… — a record write of a turn whose
# fencing token is stale (its lease was taken over) is dropped. One command per save
# keeps the client's CPU per turn low.
SAVE = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] ~= '0' and current and tonumber(current) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 6))
redis.call('PEXPIREAT', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[3])
if ARGV[4] == '1' then redis.call('SADD', KEYS[3], ARGV[3])
else redis.call('SREM', KEYS[3], ARGV[3]) end
return 1
"""
# KEYS: ledger, record; ARGV: cap, ttl s, seq, event id, max bytes, entries… — the ledger
# keeps the newest `cap` entries that fit in `max bytes` (the newest always); the record
# hash keeps the ledger's byte size (reset when the list was empty: expired or deleted)
APPEND = """
local added = 0
for i = 6, #ARGV do added = added + #ARGV[i] end
local before = redis.call('LLEN', KEYS[1])
local n = redis.call('RPUSH', KEYS[1], unpack(ARGV, 6))
local total = added
if before > 0 then total = redis.call('HINCRBY', KEYS[2], 'ledger_bytes', added) end
local cap, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[5])
while n > 0 and (n > cap or (total > max_bytes and n > 1)) do
  total = total - #redis.call('LPOP', KEYS[1])
  n = n - 1
end
redis.call('HSET', KEYS[2], 'ledger_bytes', total, 'ledger_seq', ARGV[3], 'ledger_events', ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""
# KEYS: turns hash; ARGV: turn id, record JSON, ttl s, cap — keep the newest `cap` turns
# (turn ids are ``turn-<unix ns>``: their order is their age)
SAVE_TURN = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local n = redis.call('HLEN', KEYS[1]) - tonumber(ARGV[4])
if n > 0 then
  local ids = redis.call('HKEYS', KEYS[1])
  table.sort(ids)
  for i = 1, n do redis.call('HDEL', KEYS[1], ids[i]) end
end
return 1
"""
LIST_BATCH = 200
#: most index entries one session.list page reads (a very selective filter pages on)
LIST_SCAN_MAX = 5000
_WRITES = frozenset({"save", "append", "delete", "eval", "turn", "perm", "unperm"})
#: version of the key layout. 0 (issue 6): ledger entries had no event id (``e``);
#: :meth:`RedisStore.migrate` numbers them on start.
SCHEMA_VERSION = 1
Call = Callable[[aioredis.Redis], Awaitable[Any]]


def _to_hash(r: SessionRecord, owner: str) -> dict[str, str | int | float | bytes]:
    return {
        "thread_id": r.thread_id,
        "provider": r.provider,
        "history": orjson.dumps(list(r.history)),
        "seq": r.seq,
        "last_turn_id": r.last_turn_id,
        "last_turn_status": r.last_turn_status,
        "upstream": orjson.dumps([list(kv) for kv in r.upstream]),
        "updated_at": r.updated_at,
        "events": r.events,
        "prompts": r.prompts,
        "owner": owner,  # the replica running the turn
        "principal": r.owner,  # the client the session belongs to
    }


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def _from_hash(sid: str, h: Mapping[Any, Any]) -> SessionRecord:
    def text(key: str) -> str:
        return _text(h.get(key.encode()))

    return SessionRecord(
        session_id=sid,
        thread_id=text("thread_id"),
        provider=text("provider"),
        history=tuple(orjson.loads(h.get(b"history", b"[]"))),
        seq=int(text("seq") or 0),
        last_turn_id=text("last_turn_id"),
        last_turn_status=text("last_turn_status"),
        upstream=tuple((str(k), str(v)) for k, v in orjson.loads(h.get(b"upstream", b"[]"))),
        updated_at=float(text("updated_at") or 0),
        events=int(text("events") or 0),
        owner=text("principal"),
        prompts=int(text("prompts") or 0),
    )


def _entry(item: bytes | str) -> LedgerEntry:
    e = orjson.loads(item)
    return LedgerEntry(
        int(e["p"]),
        e.get("t", ""),
        e["m"],
        float(e["ts"]),
        int(e.get("e", 0)),
        e.get("k", NOTIFICATION),
    )


class RedisStore:
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
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._ops: asyncio.Queue[Op] = asyncio.Queue()
        self.backlog = WriteBacklog(self._ops.qsize, self.name)
        #: thread id → fencing token of the turn this replica runs on it (cluster.py)
        self.fences: dict[str, int] = {}
        self._writer: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        self.counters = StoreCounters()

    def key(self, kind: str, name: str = "") -> str:
        return f"{self.prefix}{kind}:{name}" if name else f"{self.prefix}{kind}"

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        try:
            await asyncio.wait_for(self.client.ping(), self.timeout)
            await self._beat()
            await asyncio.wait_for(self.migrate(), self.timeout * 12)
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
            await asyncio.wait_for(
                self.client.set(self.key("health", self.replica_id), b"1", px=60_000), wait
            )
        except (OSError, TimeoutError, aioredis.ConnectionError, aioredis.TimeoutError) as exc:
            error = f"Redis at {self._where}: {exc or f'no answer within {wait:g}s'}"
            return StoreHealth(self.name, "reachable", False, error)
        except Exception as exc:  # it answers, but refuses the write (OOM, read-only replica)
            return StoreHealth(self.name, "writable", False, f"Redis at {self._where}: {exc}")
        self.counters.last_error = ""  # a write went through
        return StoreHealth(self.name, "reachable", True, detail=f"redis {self._where}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._ops.put_nowait(("stop",))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer, self.timeout * 2)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeat
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.delete(self.key("replica", self.replica_id)), 1)
        await self.client.aclose()

    async def _beat(self) -> None:
        ms = int(self.lease_ttl * 1000)
        await asyncio.wait_for(
            self.client.set(self.key("replica", self.replica_id), b"1", px=ms), self.timeout
        )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                await self._beat()
            except Exception as exc:  # Redis away: turns go on; liveness resumes with it
                log.warning("replica heartbeat failed", extra={"error": repr(exc)})

    async def migrate(self) -> int:
        """Bring ledgers written by an earlier layout to :data:`SCHEMA_VERSION`; how
        many were rewritten. Version 0 → 1: the entries of a ledger with no event
        ids get 1, 2, 3, … in list order (each ledger atomically, under WATCH; a
        ledger that already has event ids is left alone, so running it on several
        replicas at once is harmless). Replicas of different versions must not
        share one Redis."""
        schema = self.key("schema")
        if int(_text(await self.client.get(schema)) or 0) >= SCHEMA_VERSION:
            return 0
        rewritten = 0
        head = self.key("l", "x")[:-1]  # "<prefix>l:"
        async for raw_key in self.client.scan_iter(match=head + "*", count=500):
            key = _text(raw_key)
            rewritten += await self._migrate_ledger(key, self.key("s", key[len(head) :]))
        await self.client.set(schema, SCHEMA_VERSION)
        return rewritten

    async def _migrate_ledger(self, key: str, record_key: str) -> int:
        async with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key, record_key)
                    items = [orjson.loads(i) for i in await pipe.lrange(key, 0, -1)]
                    if not items or any("e" in i for i in items):
                        return 0
                    ttl = int(await pipe.pttl(key))
                    has_record = bool(await pipe.exists(record_key))
                    for n, item in enumerate(items, 1):
                        item["e"] = n
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.delete(key)
                    pipe.rpush(key, *(orjson.dumps(i) for i in items))
                    if ttl > 0:
                        pipe.pexpire(key, ttl)
                    if has_record:
                        pipe.hset(record_key, "ledger_events", len(items))
                    await pipe.execute()
                    return 1
                except aioredis.WatchError:
                    continue

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
        return await asyncio.wait_for(fut, self.timeout * 3)

    async def flush(self) -> None:
        """Wait until every write queued so far has reached Redis."""

        async def noop(_: aioredis.Redis) -> None:
            return None

        await self._call(noop)

    async def _ledger_top(self, db: aioredis.Redis, sid: str) -> tuple[int, int]:
        seq, events = await db.hmget(self.key("s", sid), ["ledger_seq", "ledger_events"])
        return int(_text(seq) or 0), int(_text(events) or 0)

    async def load(self, session_id: str) -> SessionRecord | None:
        async def read(db: aioredis.Redis) -> SessionRecord | None:
            h = await db.hgetall(self.key("s", session_id))
            if not h or b"thread_id" not in h:
                return None
            record = _from_hash(session_id, h)
            top = int(_text(h.get(b"ledger_seq")) or 0)
            events = int(_text(h.get(b"ledger_events")) or 0)
            if top > record.seq or events > record.events:
                record = replace(
                    record, seq=max(top, record.seq), events=max(events, record.events)
                )
            return record

        result: SessionRecord | None = await self._call(read)
        return result

    async def replay(
        self, session_id: str, after_seq: int, limit: int, *, after_event: int | None = None
    ) -> list[LedgerEntry]:
        horizon = time.time() - self._limits.ledger_max_age

        async def read(db: aioredis.Redis) -> list[LedgerEntry]:
            raw = await db.lrange(self.key("l", session_id), 0, -1)
            out = []
            for item in raw:
                e = _entry(item)
                if e.ts >= horizon and selected(e, after_seq, after_event):
                    out.append(e)
            return out[:limit]

        result: list[LedgerEntry] = await self._call(read)
        return result

    async def recover(self) -> list[str]:
        """At start: interrupt ``running`` turns whose owner replica is gone."""
        return await self._recover(skip_own=False)

    async def _recover(self, *, skip_own: bool) -> list[str]:

        async def fix(db: aioredis.Redis) -> list[str]:
            ids: list[str] = []
            for raw in await db.smembers(self.key("running")):
                sid = _text(raw)
                h = await db.hgetall(self.key("s", sid))
                if not h:
                    await db.srem(self.key("running"), sid)
                    continue
                owner = _text(h.get(b"owner"))
                if owner == self.replica_id:
                    if skip_own:
                        continue
                elif owner and await self.replica_alive(owner):
                    continue
                record = _from_hash(sid, h)
                if record.last_turn_status != RUNNING:
                    await db.srem(self.key("running"), sid)
                    continue
                fixed, entry = recovered(record, *await self._ledger_top(db, sid))
                raw_turn = await db.hget(self.key("t", sid), record.last_turn_id or "-")
                stored = TurnRecord.loads(raw_turn) if raw_turn else None
                pipe = db.pipeline(transaction=True)
                self._queue_save(pipe, fixed)
                self._queue_append(pipe, sid, [entry])
                self._queue_operator(pipe, ("turn", interrupted_turn(record, stored)))
                await pipe.execute()
                ids.append(sid)
            return ids

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
            await db.zremrangebyscore(self.key("idx"), "-inf", horizon)

        await self._call(trim)
        return 0

    # --- operator views (issue 13) ---------------------------------------------------------

    async def turns(self, session_id: str, limit: int) -> list[TurnRecord]:
        async def read(db: aioredis.Redis) -> list[TurnRecord]:
            raw = await db.hvals(self.key("t", session_id))
            return sorted(
                (TurnRecord.loads(v) for v in raw), key=lambda t: (t.started_at, t.turn_id)
            )

        result: list[TurnRecord] = await self._call(read)
        return result[-limit:] if limit > 0 else []

    async def list_sessions(self, query: SessionQuery) -> SessionPage:
        async def read(db: aioredis.Redis) -> SessionPage:
            top: Any = "+inf" if query.after is None else query.after[0]
            low: Any = query.updated_since or "-inf"
            items: list[tuple[SessionRecord, TurnRecord | None]] = []
            offset = scanned = 0
            last: tuple[float, str] | None = None
            while scanned < LIST_SCAN_MAX:
                found: Any = await db.zrevrangebyscore(
                    self.key("idx"), top, low, start=offset, num=LIST_BATCH, withscores=True
                )
                batch: list[tuple[bytes, float]] = list(found)
                if not batch:
                    return SessionPage(items, None)
                offset += len(batch)
                scanned += len(batch)
                pipe = db.pipeline(transaction=False)
                for member, _ in batch:
                    pipe.hgetall(self.key("s", _text(member)))
                hashes = await pipe.execute()
                for (member, score), h in zip(batch, hashes, strict=True):
                    sid = _text(member)
                    last = (float(score), sid)
                    if not h or b"thread_id" not in h:
                        continue  # expired record: the index is trimmed by prune
                    record = _from_hash(sid, h)
                    if not query.matches(record):
                        continue
                    raw_turn = await db.hget(self.key("t", sid), record.last_turn_id or "-")
                    turn = TurnRecord.loads(raw_turn) if raw_turn else None
                    items.append((record, turn))
                    if len(items) > query.limit:  # one more than a page: there is more
                        page = items[: query.limit]
                        edge = page[-1][0] if page else record
                        return SessionPage(page, (edge.updated_at, edge.session_id))
            return SessionPage(items, last)  # scanned enough: the next page goes on

        result: SessionPage = await self._call(read)
        return result

    async def permissions(self) -> list[PermissionRecord]:
        async def read(db: aioredis.Redis) -> list[PermissionRecord]:
            out: list[PermissionRecord] = []
            for raw in await db.smembers(self.key("perms")):
                sid = _text(raw)
                values = await db.hvals(self.key("p", sid))
                if not values:
                    await db.srem(self.key("perms"), sid)
                out += [PermissionRecord.loads(v) for v in values]
            return out

        found: list[PermissionRecord] = await self._call(read)
        alive: dict[str, bool] = {self.replica_id: True}
        pending = []
        for p in found:
            if p.owner not in alive:
                alive[p.owner] = bool(p.owner) and await self.replica_alive(p.owner)
            if alive[p.owner]:
                pending.append(p)
            else:  # its replica died: so did its turn
                self.delete_permission(p.session_id, p.request_id)
        return sorted(pending, key=lambda p: (p.created_at, p.request_id))

    # --- the writer task -------------------------------------------------------------------

    def _queue_save(self, pipe: Any, r: SessionRecord, fence: int = 0) -> None:
        skey = self.key("s", r.session_id)
        owner = self.replica_id if r.last_turn_status == RUNNING else ""
        try:
            expire_at = int((r.updated_at + self._limits.retention) * 1000)
            record = _to_hash(r, owner)
        except (TypeError, ValueError, OverflowError) as exc:
            self._dropped("save", r.session_id, exc)
            return
        fields: list[Any] = []
        for name, value in record.items():
            fields += [name, value]
        running = "1" if r.last_turn_status == RUNNING else "0"
        keys = [self.key("fence", r.thread_id), skey, self.key("running"), self.key("idx")]
        pipe.eval(
            SAVE, len(keys), *keys, fence, expire_at, r.session_id, running, r.updated_at, *fields
        )

    def _queue_append(self, pipe: Any, sid: str, entries: list[LedgerEntry]) -> None:
        """One command for consecutive entries of one session (an entry that cannot be
        encoded is dropped alone)."""
        items, kept = [], []
        for e in entries:
            try:
                item = {"p": e.pos, "e": e.event_id, "k": e.kind, "t": e.turn_id}
                items.append(orjson.dumps({**item, "ts": e.ts, "m": e.message}))
            except TypeError as exc:
                self._dropped("append", sid, exc)
                continue
            kept.append(e)
        if not items:
            return
        cap, ttl = self._limits.ledger_max_entries, int(self._limits.retention)
        # ledger_seq / ledger_events: load() needs no ledger scan
        top = max(e.pos for e in kept) // 2
        events = max(e.event_id for e in kept)
        max_bytes = self._limits.ledger_max_bytes
        keys = (self.key("l", sid), self.key("s", sid))
        pipe.eval(APPEND, 2, *keys, cap, ttl, top, events, max_bytes, *items)

    def _queue_operator(self, pipe: Any, op: Op) -> None:
        """A turn or permission write; a record that cannot be encoded is dropped alone
        (it had failed the pipeline's building, and with it every write of the batch)."""
        if op[0] == "unperm":
            pipe.hdel(self.key("p", op[1]), op[2])
            return
        record: TurnRecord | PermissionRecord = op[1]
        try:
            body = record.dumps()
        except (TypeError, ValueError) as exc:  # e.g. nested deeper than orjson writes
            self._dropped(op[0], record.session_id, exc)
            return
        ttl = int(self._limits.retention)
        if isinstance(record, TurnRecord):
            key = self.key("t", record.session_id)
            pipe.eval(SAVE_TURN, 1, key, record.turn_id, body, ttl, TURNS_PER_SESSION)
        else:
            pipe.hset(self.key("p", record.session_id), record.request_id, body)
            pipe.expire(self.key("p", record.session_id), ttl)
            pipe.sadd(self.key("perms"), record.session_id)

    def queue_eval(
        self, script: str, keys: list[str], args: list[str | int]
    ) -> asyncio.Future[None]:
        """Queue a script with the writes: it runs after every write queued before it.
        The future resolves once the batch holding it has been sent."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ops.put_nowait(("eval", script, keys, args, done))
        return done

    async def _flush(self, writes: list[Op]) -> None:
        if not writes:
            return
        pipe = self.client.pipeline(transaction=False)
        appends: dict[str, list[LedgerEntry]] = {}
        for op in writes:
            if op[0] == "append":  # a run of appends: one command per session
                appends.setdefault(op[1], []).append(op[2])
                continue
            for sid, entries in appends.items():
                self._queue_append(pipe, sid, entries)
            appends.clear()
            if op[0] == "save":
                self._queue_save(pipe, op[1], op[2])
            elif op[0] == "eval":
                pipe.eval(op[1], len(op[2]), *op[2], *op[3])
            elif op[0] in ("turn", "perm", "unperm"):
                self._queue_operator(pipe, op)
            else:
                sid = op[1]
                pipe.delete(
                    self.key("s", sid), self.key("l", sid), self.key("t", sid), self.key("p", sid)
                )
                pipe.srem(self.key("running"), sid)
                pipe.zrem(self.key("idx"), sid)
        for sid, entries in appends.items():
            self._queue_append(pipe, sid, entries)
        try:
            await asyncio.wait_for(pipe.execute(), self.timeout)
        except Exception as exc:
            self.counters.write_errors += len(writes)
            self.counters.last_error = f"{type(exc).__name__}: {exc}"[:300]
            log.exception("session store write failed", extra={"ops": len(writes)})
        else:
            self.counters.last_error = ""
        for op in writes:
            if op[0] == "eval" and not op[4].done():
                op[4].set_result(None)
        writes.clear()

    def _dropped(self, kind: str, session_id: str, exc: Exception) -> None:
        self.counters.bad_records += 1
        log.error(
            "session store dropped a record",
            extra={"op": kind, "session_id": session_id[:128], "error": f"{exc}"[:300]},
        )

    async def _serve(self) -> None:
        """Per batch: every queued write in one pipeline, then every queued read at once.

        A read sees every write queued before it, and possibly some queued after it
        in the same batch (the catch-up stream de-duplicates that overlap); one
        batch costs two round trips however many turns share it. Nothing ends the
        loop but ``stop``: a batch that fails is logged and its readers get the error.
        """
        while True:
            batch = [await self._ops.get()]
            while len(batch) < MAX_BATCH and not self._ops.empty():
                batch.append(self._ops.get_nowait())
            try:
                writes = [op for op in batch if op[0] in _WRITES]
                reads = [op for op in batch if op[0] == "call"]
                await self._flush(writes)
                await self._run_reads(reads)
            except Exception as exc:
                self.counters.restarts += 1
                log.exception("session store batch failed; the writer goes on")
                for op in batch:
                    if op[0] == "call" and not op[2].done():
                        op[2].set_exception(exc)
                    elif op[0] == "eval" and not op[4].done():
                        op[4].set_result(None)
            self.backlog.drained()
            if any(op[0] == "stop" for op in batch):
                return

    async def _run_reads(self, reads: list[Op]) -> None:
        """Consecutive reads run concurrently (one round trip for all of them)."""
        if reads:
            await asyncio.gather(*(self._read(fn, fut) for _, fn, fut in reads))
            reads.clear()

    async def _read(self, fn: Call, fut: asyncio.Future[Any]) -> None:
        if fut.done():
            return
        try:
            value = await asyncio.wait_for(fn(self.client), self.timeout * 2)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(value)
