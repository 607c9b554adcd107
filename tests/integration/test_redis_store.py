"""The Redis store against a real ``redis-server``: what its writes leave in Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.redis_server import redis_server
from xwm_bridge.store.base import (
    COMPLETED,
    RESULT,
    RUNNING,
    LedgerEntry,
    SessionRecord,
    StoreLimits,
)
from xwm_bridge.store.redis import RedisStore

pytestmark = pytest.mark.asyncio


def result() -> LedgerEntry:
    return LedgerEntry(
        3, "turn-1", {"jsonrpc": "2.0", "id": 1, "result": {}}, event_id=2, kind=RESULT
    )


async def test_an_append_after_a_close_leaves_no_record_without_expiry(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, StoreLimits(), prefix="leak:")
        await store.start()
        try:
            # a turn's final save, then a session.close (here: any replica), then the
            # turn's result entry
            store.save(SessionRecord("s1", "t1", last_turn_status=COMPLETED))
            store.delete("s1")
            store.append("s1", result())
            await store.flush()
            # the ledger's fields kept beside it expire with it (they had no expiry)
            assert 0 < await store.client.pttl("leak:s:s1") <= 7 * 86400 * 1000
            assert await store.load("s1") is None  # and are no record
            # nothing the store wrote lives for ever (the liveness and schema keys
            # aside: one per replica, refreshed; one per prefix)
            for raw in await store.client.keys("leak:*"):
                name = raw.decode()
                if name.startswith(("leak:replica:", "leak:schema")):
                    continue
                assert await store.client.pttl(name) > 0, name
            # a record saved there later keeps its own expiry: none while running
            store.save(SessionRecord("s1", "t1", last_turn_status=RUNNING))
            store.append("s1", LedgerEntry(4, "turn-2", {"n": 2}, event_id=3))
            await store.flush()
            assert await store.client.pttl("leak:s:s1") == -1
            loaded = await store.load("s1")
            assert loaded is not None and loaded.events == 3
        finally:
            await store.close()


async def test_appends_to_a_live_session_keep_its_record_and_expiry(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, StoreLimits(), prefix="live:")
        await store.start()
        try:
            store.save(SessionRecord("s1", "t1", last_turn_status=RUNNING))
            store.append("s1", LedgerEntry(2, "turn-1", {"n": 1}, event_id=1))
            await store.flush()
            assert await store.client.pttl("live:s:s1") == -1  # running: until the turn ends
            store.save(SessionRecord("s1", "t1", seq=1, events=1, last_turn_status=COMPLETED))
            store.append("s1", result())
            await store.flush()
            assert await store.client.pttl("live:s:s1") > 0
            loaded = await store.load("s1")
            assert loaded is not None and loaded.events == 2
            assert [e.event_id for e in await store.replay("s1", 0, 10)] == [1, 2]
        finally:
            await store.close()
