"""The Redis store's key layout (sans writer task): its keys, the layout version, how a
session record and a ledger entry are stored in them, and the migration of ledgers
written by an earlier layout, run when a replica starts. Keys (``prefix`` first):

* ``s:<sid>``  hash — the record, plus ``owner``: the replica running its turn
* ``l:<sid>``  list — ledger entries (JSON ``{p, e, k, t, ts, m}``: seq position, event
  id, kind, turn, time, message), trimmed to the cap
* ``schema``   the key layout's version (:data:`SCHEMA_VERSION`)
* ``running``  set  — sessions whose last turn is ``running``
* ``idx``      sorted set — session ids by ``updated_at`` (``session.list``)
* ``t:<sid>``  hash — turn id → turn record JSON, the newest ``TURNS_PER_SESSION``
* ``p:<sid>``  hash — request id → pending permission record JSON; ``perms``: set of
  the sessions that have one
* ``replica:<id>`` — a replica's liveness key, refreshed every ``lease_ttl / 3``
* ``health:<id>`` — the health probe's key; ``fence:<thread>`` and the thread queue's
  other keys are ``cluster.py``'s

Records and ledgers expire after ``retention`` (refreshed on every write; a running
session's record not until its turn ends), so retention costs nothing. The scripts that
write them: ``redis_writes.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
import redis.asyncio as aioredis

from xwm_bridge.store.base import NOTIFICATION, LedgerEntry, SessionRecord

#: version of the key layout. 0 (issue 6): ledger entries had no event id (``e``);
#: :func:`migrate` numbers them on start.
SCHEMA_VERSION = 1


def key(prefix: str, kind: str, name: str = "") -> str:
    return f"{prefix}{kind}:{name}" if name else f"{prefix}{kind}"


def to_hash(r: SessionRecord, owner: str) -> dict[str, str | int | float | bytes]:
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


def text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


def from_hash(sid: str, h: Mapping[Any, Any]) -> SessionRecord:
    def field(name: str) -> str:
        return text(h.get(name.encode()))

    return SessionRecord(
        session_id=sid,
        thread_id=field("thread_id"),
        provider=field("provider"),
        history=tuple(orjson.loads(h.get(b"history", b"[]"))),
        seq=int(field("seq") or 0),
        last_turn_id=field("last_turn_id"),
        last_turn_status=field("last_turn_status"),
        upstream=tuple((str(k), str(v)) for k, v in orjson.loads(h.get(b"upstream", b"[]"))),
        updated_at=float(field("updated_at") or 0),
        events=int(field("events") or 0),
        owner=field("principal"),
        prompts=int(field("prompts") or 0),
    )


def load_entry(item: bytes | str) -> LedgerEntry:
    e = orjson.loads(item)
    return LedgerEntry(
        int(e["p"]),
        e.get("t", ""),
        e["m"],
        float(e["ts"]),
        int(e.get("e", 0)),
        e.get("k", NOTIFICATION),
    )


def glob_escape(text: str) -> str:
    """``text`` as a literal in a ``SCAN MATCH`` pattern (a prefix may hold ``*``,
    ``?``, ``[`` …, which would match other prefixes' keys)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


async def migrate(client: aioredis.Redis, prefix: str) -> int:
    """Bring ledgers written by an earlier layout to :data:`SCHEMA_VERSION`; how
    many were rewritten. Version 0 → 1: the entries of a ledger with no event
    ids get 1, 2, 3, … in list order (each ledger atomically, under WATCH; a
    ledger that already has event ids is left alone, so running it on several
    replicas at once is harmless). Replicas of different versions must not
    share one Redis."""
    schema = key(prefix, "schema")
    if int(text(await client.get(schema)) or 0) >= SCHEMA_VERSION:
        return 0
    rewritten = 0
    head = key(prefix, "l", "x")[:-1]  # "<prefix>l:"
    async for raw_key in client.scan_iter(match=glob_escape(head) + "*", count=500):
        ledger = text(raw_key)
        rewritten += await _migrate_ledger(client, ledger, key(prefix, "s", ledger[len(head) :]))
    await client.set(schema, SCHEMA_VERSION)
    return rewritten


async def _migrate_ledger(client: aioredis.Redis, ledger: str, record_key: str) -> int:
    async with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                await pipe.watch(ledger, record_key)
                items = [orjson.loads(i) for i in await pipe.lrange(ledger, 0, -1)]
                if not items or any("e" in i for i in items):
                    return 0
                ttl = int(await pipe.pttl(ledger))
                has_record = bool(await pipe.exists(record_key))
                for n, item in enumerate(items, 1):
                    item["e"] = n
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.delete(ledger)
                pipe.rpush(ledger, *(orjson.dumps(i) for i in items))
                if ttl > 0:
                    pipe.pexpire(ledger, ttl)
                if has_record:
                    pipe.hset(record_key, "ledger_events", len(items))
                await pipe.execute()
                return 1
            except aioredis.WatchError:
                continue
