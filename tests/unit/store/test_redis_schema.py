"""xwm_bridge.store.redis_schema: keys, and a record and an entry as Redis holds them (no Redis)."""

from __future__ import annotations

from typing import Any

import orjson

from xwm_bridge.store.base import NOTIFICATION, SessionRecord
from xwm_bridge.store.redis_schema import from_hash, key, load_entry, text, to_hash


def as_redis_returns(fields: dict[str, Any]) -> dict[bytes, bytes]:
    """``HGETALL`` of what ``HSET`` wrote: bytes names, values encoded as redis-py does."""
    return {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}


def test_keys_start_with_the_prefix() -> None:
    assert key("xwm:", "s", "abc") == "xwm:s:abc"
    assert key("xwm:", "running") == "xwm:running"


def test_a_record_reads_back_as_it_was_written() -> None:
    record = SessionRecord(
        "s1",
        "t1",
        provider="p",
        history=("a", "b"),
        seq=7,
        last_turn_id="turn-1",
        last_turn_status="completed",
        upstream=(("acpSessionId", "u1"),),
        updated_at=1234.5,
        events=9,
        owner="principal",
        prompts=3,
    )
    h = as_redis_returns(to_hash(record, "replica-1"))
    assert h[b"owner"] == b"replica-1" and h[b"principal"] == b"principal"
    assert from_hash("s1", h) == record


def test_a_hash_without_fields_reads_as_defaults() -> None:
    record = from_hash("s", {b"thread_id": b"t"})
    assert (record.thread_id, record.seq, record.history, record.upstream) == ("t", 0, (), ())


def test_an_entry_of_the_first_layout_has_no_event_id_and_is_a_notification() -> None:
    e = load_entry(orjson.dumps({"p": 4, "t": "turn-1", "ts": 1.5, "m": {"x": 1}}))
    assert (e.pos, e.turn_id, e.message, e.ts, e.event_id, e.kind) == (
        4,
        "turn-1",
        {"x": 1},
        1.5,
        0,
        NOTIFICATION,
    )


def test_text_of_bytes_str_and_nothing() -> None:
    assert (text(b"a"), text("b"), text(None)) == ("a", "b", "")
