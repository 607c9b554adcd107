"""The in-memory store keeps its ledger encoded (no object per entry for the GC), and
holds its turn and permission records within its byte bound."""

from __future__ import annotations

import asyncio
import gc
import time

from xwm_bridge.store import memory as memory_store
from xwm_bridge.store.base import COMPLETED, RUNNING, LedgerEntry, SessionRecord, StoreLimits
from xwm_bridge.store.memory import MemoryStore
from xwm_bridge.store.records import PermissionRecord, TurnRecord


def _message(i: int) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "method": "session.update",
        "params": {"sessionId": "s", "seq": i, "update": {"delta": f"chunk {i}", "tags": [i]}},
    }


def test_ledger_entries_add_no_tracked_objects_and_replay_decodes_them() -> None:
    store = MemoryStore()
    n = 2000
    entries = [LedgerEntry(2 * i + 1, "t1", _message(i), event_id=i + 1) for i in range(n)]
    gc.collect()
    before = len(gc.get_objects())
    for entry in entries:
        store.append("s", entry)
    del entries, entry
    gc.collect()
    grown = len(gc.get_objects()) - before
    # decoded entries would hold n LedgerEntry objects plus their dicts and lists
    assert grown < n // 20, grown
    out = asyncio.run(store.replay("s", 0, 10, after_event=n - 3))
    assert [e.event_id for e in out] == [n - 2, n - 1, n]
    assert out[0].message == _message(n - 3) and out[0].turn_id == "t1"
    assert out[0].pos == 2 * (n - 3) + 1
    assert len(asyncio.run(store.replay("s", 0, 5))) == 5


def test_prune_drops_turn_records_of_sessions_gone() -> None:
    """A turn that finishes after its session was closed leaves a turn record with no
    session record: the prune drops it, as the SQLite store's does."""
    store = MemoryStore()
    store.save(SessionRecord("kept", "t", updated_at=time.time()))
    store.save_turn(TurnRecord("kept", "turn-1", started_at=1.0))
    store.delete("closed")  # session.close while its turn ran
    store.save_turn(TurnRecord("closed", "turn-1", started_at=1.0))  # the turn ends
    assert asyncio.run(store.prune()) == 0
    assert asyncio.run(store.turns("closed", 10)) == []
    assert [t.turn_id for t in asyncio.run(store.turns("kept", 10))] == ["turn-1"]
    assert set(store._turns) == {"kept"}


def test_the_global_cap_never_evicts_a_running_session() -> None:
    store = MemoryStore(StoreLimits(memory_max_bytes=50_000))
    big = "p" * 10_000
    store.save(SessionRecord("running", "t", history=(big,), last_turn_status=RUNNING))
    store.save_turn(TurnRecord("running", "turn-0", started_at=1.0))
    store.save_permission(PermissionRecord("running", "req-1", "turn-1"))
    for i in range(10):  # idle sessions, saved after it: they go instead
        store.save(SessionRecord(f"idle{i}", "t", history=(big,), last_turn_status=COMPLETED))
    assert store.bytes_held <= 50_000
    assert asyncio.run(store.load("running")) is not None
    assert [t.turn_id for t in asyncio.run(store.turns("running", 10))] == ["turn-0"]
    assert [p.request_id for p in asyncio.run(store.permissions())] == ["req-1"]
    assert asyncio.run(store.load("idle9")) is not None  # the newest idle one fits
    assert asyncio.run(store.load("idle0")) is None
    # only running sessions left over the cap: they stay, and saving does not spin
    store.save(SessionRecord("running2", "t", history=(big * 5,), last_turn_status=RUNNING))
    assert asyncio.run(store.load("running")) is not None
    assert asyncio.run(store.load("running2")) is not None
    # once its turn has ended the session may go like any other
    store.save(SessionRecord("running", "t", history=(big,), last_turn_status=COMPLETED))
    store.save(SessionRecord("later", "t", history=("x",)))
    assert asyncio.run(store.load("running")) is None


def _held(store: MemoryStore, sessions: list[str]) -> int:
    """What the store holds, as its byte bound counts it, recomputed from its views."""
    overhead = memory_store.ENTRY_OVERHEAD
    total = sum(memory_store.record_size(r) for r in store._records.values())
    total += sum(k[6] for ledger in store._ledgers.values() for k in ledger)
    for sid in sessions:
        total += sum(len(t.dumps()) + overhead for t in asyncio.run(store.turns(sid, 1000)))
    total += sum(len(p.dumps()) + overhead for p in asyncio.run(store.permissions()))
    return total


def test_turn_and_permission_records_count_in_the_cap_and_the_oldest_go() -> None:
    """Turn records (64 per session, each up to 256 KiB) and pending permission
    requests were held outside ``memory_max_bytes``: sessions of a few bytes each could
    hold any amount of them. They count now, and past the cap the oldest go with the
    oldest ledger entries (a running session's stay)."""
    cap = 200_000
    store = MemoryStore(StoreLimits(memory_max_bytes=cap))
    result = {"output": "r" * 4000}
    sessions = [f"s{i}" for i in range(40)]
    store.save(SessionRecord("running", "t", last_turn_status=RUNNING))
    store.save_turn(TurnRecord("running", "turn-r", started_at=1.0, result=result))
    store.save_permission(PermissionRecord("running", "req-r", "turn-r", created_at=1.0))
    for n, sid in enumerate(sessions):
        store.save(SessionRecord(sid, "t", updated_at=time.time()))
        for i in range(10):
            started = float(n * 10 + i)
            store.save_turn(TurnRecord(sid, f"turn-{i}", started_at=started, result=result))
            store.append(sid, LedgerEntry(2 * i + 1, f"turn-{i}", _message(i), event_id=i + 1))
        store.save_permission(
            PermissionRecord(sid, "req-1", "turn-9", tool_call={"input": "p" * 2000})
        )
        # the same turn saved again (its end) replaces its bytes, not adds to them
        store.save_turn(TurnRecord(sid, "turn-9", started_at=n * 10 + 9.0, result=result))
        assert store.bytes_held == _held(store, ["running", *sessions])
        assert store.bytes_held <= cap
    # the newest session keeps its newest turns; the oldest sessions' turns went first
    assert [t.turn_id for t in asyncio.run(store.turns("s39", 1))] == ["turn-9"]
    assert asyncio.run(store.turns("s0", 100)) == []
    assert [t.turn_id for t in asyncio.run(store.turns("running", 10))] == ["turn-r"]
    assert ("running", "req-r") in [p.key for p in asyncio.run(store.permissions())]
    # and what is given up is given back: a delete and a prune leave nothing counted
    for sid in ["running", *sessions]:
        store.delete(sid)
    store.save_turn(TurnRecord("gone", "turn-1", started_at=1.0, result=result))
    asyncio.run(store.prune())
    assert store.bytes_held == 0
