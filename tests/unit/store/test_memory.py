"""The in-memory store keeps its ledger encoded: no object per entry for the GC."""

from __future__ import annotations

import asyncio
import gc

from xwm_bridge.store.base import LedgerEntry
from xwm_bridge.store.memory import MemoryStore


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
