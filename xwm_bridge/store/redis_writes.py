"""What a batch of the Redis store's writes becomes (sans connection): the Lua scripts of
a save, a run of ledger appends and a turn record, and the pipeline commands of each
queued write (:class:`Commands`). The writer task (``redis.py``) sends a batch's
commands as one pipeline; a record that cannot be encoded is dropped alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from xwm_bridge.store.base import RUNNING, LedgerEntry, SessionRecord, StoreLimits
from xwm_bridge.store.records import TURNS_PER_SESSION, PermissionRecord, TurnRecord
from xwm_bridge.store.redis_schema import key, to_hash

#: a queued operation: its kind, then its arguments
Op = tuple[Any, ...]
#: the kinds of operation that are writes (the others: ``call``, ``stop``)
WRITES = frozenset({"save", "append", "delete", "eval", "turn", "perm", "unperm"})
#: told of a record left out: the write's kind, its session id, why
Dropped = Callable[[str, str, Exception], None]
# KEYS: fence, record, running, index; ARGV: token (0 = unfenced), expire-at ms, session
# id, running 0/1, updated-at (the index score), fields… — a record write of a turn whose
# fencing token is stale (its lease was taken over) is dropped. A running session's record
# does not expire (a turn may outlast the retention; a dead replica's is recovered by
# another). One command per save keeps the client's CPU per turn low.
SAVE = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] ~= '0' and current and tonumber(current) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 6))
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[3])
if ARGV[4] == '1' then
  redis.call('PERSIST', KEYS[2])
  redis.call('SADD', KEYS[3], ARGV[3])
else
  redis.call('PEXPIREAT', KEYS[2], ARGV[2])
  redis.call('SREM', KEYS[3], ARGV[3])
end
return 1
"""
# KEYS: index, running; ARGV: horizon, batch, offset — look at up to `batch` index entries
# older than the horizon after the first `offset` (running sessions kept by earlier
# batches) and drop those not running; how many were looked at and kept
TRIM_INDEX = """
local stale = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', ARGV[3], ARGV[2])
local kept = 0
for _, sid in ipairs(stale) do
  if redis.call('SISMEMBER', KEYS[2], sid) == 1 then kept = kept + 1
  else redis.call('ZREM', KEYS[1], sid) end
end
return {#stale, kept}
"""
# KEYS: ledger, record; ARGV: cap, ttl s, seq, event id, max bytes, entries… — the ledger
# keeps the newest `cap` entries that fit in `max bytes` (the newest always); the record
# hash keeps the ledger's byte size (reset when the list was empty: expired or deleted).
# A hash without a record (its session closed meanwhile: a session.close on another
# replica between a turn's final save and its result entry) expires with the ledger: it
# had no expiry, and nothing ever removed it. A record keeps its own (SAVE's).
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
if redis.call('HEXISTS', KEYS[2], 'thread_id') == 0 then redis.call('EXPIRE', KEYS[2], ARGV[2]) end
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


class Commands:
    """The pipeline commands of one store's writes: its keys (``prefix``), its limits,
    the replica that owns the turns it saves as running. A record that cannot be
    encoded is told to ``dropped`` and left out alone."""

    def __init__(self, prefix: str, limits: StoreLimits, replica_id: str, dropped: Dropped) -> None:
        self.prefix = prefix
        self.limits = limits
        self.replica_id = replica_id
        self.dropped = dropped

    def key(self, kind: str, name: str = "") -> str:
        return key(self.prefix, kind, name)

    def batch(self, pipe: Any, writes: list[Op]) -> None:
        """Every write of a batch, in order; a run of appends is one command per session."""
        appends: dict[str, list[LedgerEntry]] = {}
        for op in writes:
            if op[0] == "append":  # a run of appends: one command per session
                appends.setdefault(op[1], []).append(op[2])
                continue
            for sid, entries in appends.items():
                self.append(pipe, sid, entries)
            appends.clear()
            if op[0] == "save":
                self.save(pipe, op[1], op[2])
            elif op[0] == "eval":
                pipe.eval(op[1], len(op[2]), *op[2], *op[3])
            elif op[0] in ("turn", "perm", "unperm"):
                self.operator(pipe, op)
            else:
                self.delete(pipe, op[1])
        for sid, entries in appends.items():
            self.append(pipe, sid, entries)

    def save(self, pipe: Any, r: SessionRecord, fence: int = 0) -> None:
        skey = self.key("s", r.session_id)
        owner = self.replica_id if r.last_turn_status == RUNNING else ""
        try:
            expire_at = int((r.updated_at + self.limits.retention) * 1000)
            record = to_hash(r, owner)
        except (TypeError, ValueError, OverflowError) as exc:
            self.dropped("save", r.session_id, exc)
            return
        fields: list[Any] = []
        for name, value in record.items():
            fields += [name, value]
        running = "1" if r.last_turn_status == RUNNING else "0"
        keys = [self.key("fence", r.thread_id), skey, self.key("running"), self.key("idx")]
        pipe.eval(
            SAVE, len(keys), *keys, fence, expire_at, r.session_id, running, r.updated_at, *fields
        )

    def append(self, pipe: Any, sid: str, entries: list[LedgerEntry]) -> None:
        """One command for consecutive entries of one session (an entry that cannot be
        encoded is dropped alone)."""
        items, kept = [], []
        for e in entries:
            try:
                item = {"p": e.pos, "e": e.event_id, "k": e.kind, "t": e.turn_id}
                items.append(orjson.dumps({**item, "ts": e.ts, "m": e.message}))
            except TypeError as exc:
                self.dropped("append", sid, exc)
                continue
            kept.append(e)
        if not items:
            return
        cap, ttl = self.limits.ledger_max_entries, int(self.limits.retention)
        # ledger_seq / ledger_events: load() needs no ledger scan
        top = max(e.pos for e in kept) // 2
        events = max(e.event_id for e in kept)
        max_bytes = self.limits.ledger_max_bytes
        keys = (self.key("l", sid), self.key("s", sid))
        pipe.eval(APPEND, 2, *keys, cap, ttl, top, events, max_bytes, *items)

    def operator(self, pipe: Any, op: Op) -> None:
        """A turn or permission write; a record that cannot be encoded is dropped alone
        (it had failed the pipeline's building, and with it every write of the batch)."""
        if op[0] == "unperm":
            pipe.hdel(self.key("p", op[1]), op[2])
            return
        record: TurnRecord | PermissionRecord = op[1]
        try:
            body = record.dumps()
        except (TypeError, ValueError) as exc:  # e.g. nested deeper than orjson writes
            self.dropped(op[0], record.session_id, exc)
            return
        ttl = int(self.limits.retention)
        if isinstance(record, TurnRecord):
            turns = self.key("t", record.session_id)
            pipe.eval(SAVE_TURN, 1, turns, record.turn_id, body, ttl, TURNS_PER_SESSION)
        else:
            pipe.hset(self.key("p", record.session_id), record.request_id, body)
            pipe.expire(self.key("p", record.session_id), ttl)
            pipe.sadd(self.key("perms"), record.session_id)

    def delete(self, pipe: Any, sid: str) -> None:
        pipe.delete(self.key("s", sid), self.key("l", sid), self.key("t", sid), self.key("p", sid))
        pipe.srem(self.key("running"), sid)
        pipe.zrem(self.key("idx"), sid)
