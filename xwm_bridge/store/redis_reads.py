"""The Redis store's reads as functions of a connection (sans writer task): a record
with its ledger's top, a ledger's entries, a session's turns, a page of the session
index, the pending permission requests. The writer task (``redis.py``) runs them after
the writes queued before them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rex

from xwm_bridge.store.base import LedgerEntry, SessionRecord, selected
from xwm_bridge.store.records import PermissionRecord, SessionPage, SessionQuery, TurnRecord
from xwm_bridge.store.redis_schema import from_hash, key, load_entry, text

#: Redis answers that mean it cannot serve for now, or is not let to by its operator:
#: a replica (READONLY; MASTERDOWN when it serves no stale data), memory full (OOM), a
#: dataset loading (LOADING), a script running (BUSY), its disk failing (MISCONF), too
#: few replicas (NOREPLICAS), a cluster reconfiguring (TRYAGAIN, CLUSTERDOWN), an ACL
#: (NOPERM). An outage of the store, not a bug; every other error answer (WRONGTYPE,
#: ERR …, NOSCRIPT, EXECABORT) is one, and keeps its traceback.
REFUSED = ("READONLY", "MASTERDOWN", "OOM", "LOADING", "BUSY", "MISCONF", "NOREPLICAS")
REFUSED_TOO = ("TRYAGAIN", "CLUSTERDOWN", "NOPERM")
REFUSALS = (
    rex.ReadOnlyError,
    rex.OutOfMemoryError,
    rex.BusyLoadingError,
    rex.TryAgainError,
    rex.ClusterDownError,
    rex.NoPermissionError,
)
LIST_BATCH = 200
#: most index entries one session.list page reads (a very selective filter pages on)
LIST_SCAN_MAX = 5000


async def ledger_top(db: aioredis.Redis, prefix: str, sid: str) -> tuple[int, int]:
    """The highest bridge seq and event id the session's ledger has had."""
    seq, events = await db.hmget(key(prefix, "s", sid), ["ledger_seq", "ledger_events"])
    return int(text(seq) or 0), int(text(events) or 0)


async def record(db: aioredis.Redis, prefix: str, session_id: str) -> SessionRecord | None:
    """The session's record, its ``seq`` and ``events`` at least its ledger's top."""
    h = await db.hgetall(key(prefix, "s", session_id))
    if not h or b"thread_id" not in h:
        return None
    found = from_hash(session_id, h)
    top = int(text(h.get(b"ledger_seq")) or 0)
    events = int(text(h.get(b"ledger_events")) or 0)
    if top > found.seq or events > found.events:
        found = replace(found, seq=max(top, found.seq), events=max(events, found.events))
    return found


async def ledger(
    db: aioredis.Redis,
    prefix: str,
    session_id: str,
    after_seq: int,
    limit: int,
    after_event: int | None,
    horizon: float,
) -> list[LedgerEntry]:
    """The first ``limit`` entries after the cursor, none older than ``horizon``."""
    raw = await db.lrange(key(prefix, "l", session_id), 0, -1)
    out = []
    for item in raw:
        e = load_entry(item)
        if e.ts >= horizon and selected(e, after_seq, after_event):
            out.append(e)
    return out[:limit]


async def last_turn(db: aioredis.Redis, prefix: str, r: SessionRecord) -> TurnRecord | None:
    raw_turn = await db.hget(key(prefix, "t", r.session_id), r.last_turn_id or "-")
    return TurnRecord.loads(raw_turn) if raw_turn else None


async def turns(db: aioredis.Redis, prefix: str, session_id: str) -> list[TurnRecord]:
    """Every stored turn of the session, oldest first."""
    raw = await db.hvals(key(prefix, "t", session_id))
    return sorted((TurnRecord.loads(v) for v in raw), key=lambda t: (t.started_at, t.turn_id))


async def session_page(db: aioredis.Redis, prefix: str, query: SessionQuery) -> SessionPage:
    """Newest ``updated_at`` first from the index, each record with its last turn; at
    most :data:`LIST_SCAN_MAX` index entries read (the next page goes on from there)."""
    top: Any = "+inf" if query.after is None else query.after[0]
    low: Any = query.updated_since or "-inf"
    items: list[tuple[SessionRecord, TurnRecord | None]] = []
    offset = scanned = 0
    last: tuple[float, str] | None = None
    while scanned < LIST_SCAN_MAX:
        found: Any = await db.zrevrangebyscore(
            key(prefix, "idx"), top, low, start=offset, num=LIST_BATCH, withscores=True
        )
        batch: list[tuple[bytes, float]] = list(found)
        if not batch:
            return SessionPage(items, None)
        offset += len(batch)
        scanned += len(batch)
        pipe = db.pipeline(transaction=False)
        for member, _ in batch:
            pipe.hgetall(key(prefix, "s", text(member)))
        hashes = await pipe.execute()
        for (member, score), h in zip(batch, hashes, strict=True):
            sid = text(member)
            last = (float(score), sid)
            if not h or b"thread_id" not in h:
                continue  # expired record: the index is trimmed by prune
            r = from_hash(sid, h)
            if not query.matches(r):
                continue
            items.append((r, await last_turn(db, prefix, r)))
            if len(items) > query.limit:  # one more than a page: there is more
                page = items[: query.limit]
                edge = page[-1][0] if page else r
                return SessionPage(page, (edge.updated_at, edge.session_id))
    return SessionPage(items, last)  # scanned enough: the next page goes on


async def permissions(db: aioredis.Redis, prefix: str) -> list[PermissionRecord]:
    """Every stored pending request (of live replicas or not); a session whose hash has
    expired leaves the ``perms`` set."""
    out: list[PermissionRecord] = []
    for raw in await db.smembers(key(prefix, "perms")):
        sid = text(raw)
        values = await db.hvals(key(prefix, "p", sid))
        if not values:
            await db.srem(key(prefix, "perms"), sid)
        out += [PermissionRecord.loads(v) for v in values]
    return out


def refused(exc: BaseException) -> bool:
    """Whether a Redis error answer is a refusal of the backend (:data:`REFUSED`)
    rather than a bug. redis-py strips the code of the answers it has a class for and
    keeps the others' (``BUSY …``), prefixed in a pipeline (``… caused error: BUSY …``)."""
    if isinstance(exc, REFUSALS):
        return True
    if not isinstance(exc, rex.ResponseError):
        return False
    answer = str(exc).rsplit("caused error: ", 1)[-1]
    return answer.split(" ", 1)[0] in REFUSED + REFUSED_TOO
