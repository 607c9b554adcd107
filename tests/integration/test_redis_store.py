"""The Redis store against a real ``redis-server``: what its writes leave in Redis."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

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
from xwm_bridge.store.redis_client import RETRIES

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


async def test_one_redis_command_is_one_attempt_within_redis_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The client's retry policy is explicit (no retries) and its socket deadlines are
    ``redis_timeout`` whatever the URL says: a command Redis does not answer (the
    server stopped) fails within ``redis_timeout``, even without a deadline of its own.
    A URL's ``socket_timeout=30&retry_on_timeout=true`` had made that 2 x 30 s."""
    async with redis_server(tmp_path) as server:
        url = f"{server.url}?socket_timeout=30&retry_on_timeout=true"
        store = RedisStore(url, prefix="rt:", timeout=0.5)
        await store.start()
        try:
            ignored = [r for r in caplog.records if "redis_url options ignored" in r.message]
            assert [r.__dict__["options"] for r in ignored] == [["socket_timeout"]]
            retry = store.client.get_retry()
            assert retry is not None and retry.get_retries() == RETRIES == 0
            server.proc.send_signal(signal.SIGSTOP)
            try:
                started = time.monotonic()
                with pytest.raises(aioredis.TimeoutError):  # redis-py's, not the test's
                    await asyncio.wait_for(store.replica_alive("other"), 5)
                assert time.monotonic() - started < 2.5
            finally:
                server.proc.send_signal(signal.SIGCONT)
            assert await store.replica_alive(store.replica_id)  # and it answers again
        finally:
            await store.close()


async def test_close_ends_the_heartbeat_even_when_its_cancel_is_lost(tmp_path: Path) -> None:
    """redis-py bounds each command's write with ``asyncio.wait_for``, which on CPython
    3.11 returns the write's result and drops a cancel of the caller landing in the same
    loop iteration: the heartbeat went on beating and ``close()``, awaiting it with no
    deadline, never returned (a teardown of test_cluster_leases.py hung so, the loop
    running). Here the heartbeat's beat swallows the first cancel, as that write does."""
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="hb:", timeout=0.5, lease_ttl=0.3)
        await store.start()
        beating = asyncio.Event()
        swallowed: list[bool] = []

        async def beat_losing_a_cancel() -> None:
            beating.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # lost, as in redis-py's write

        store._beat = beat_losing_a_cancel  # type: ignore[method-assign]
        await asyncio.wait_for(beating.wait(), 5)
        started = time.monotonic()
        await asyncio.wait_for(store.close(), 5)
        assert time.monotonic() - started < 2  # not the test's deadline cancelling it
        assert swallowed == [True]
        assert store._heartbeat is not None and store._heartbeat.done()


async def test_two_replicas_recovering_one_dead_turn_interrupt_it_once(tmp_path: Path) -> None:
    """Every replica's prune recovers the running turns of dead replicas, and a replica
    taking a thread over does too: two of them at once recovered the same turn twice
    (two final updates with the same event id in the ledger, two ``interrupted``
    saves), and a recovery that read the record before another replica started a new
    turn on it overwrote that turn's ``running`` record with the old one, interrupted."""
    async with redis_server(tmp_path) as server:
        dead = RedisStore(server.url, StoreLimits(), prefix="rec:", replica_id="dead")
        a = RedisStore(server.url, StoreLimits(), prefix="rec:", replica_id="a")
        b = RedisStore(server.url, StoreLimits(), prefix="rec:", replica_id="b")
        await dead.start()
        await a.start()
        await b.start()
        try:
            dead.save(SessionRecord("s1", "t1", last_turn_id="turn-1", last_turn_status=RUNNING))
            dead.append("s1", LedgerEntry(2, "turn-1", {"n": 1}, event_id=1))
            await dead.flush()
            await dead.client.delete("rec:replica:dead")  # its liveness key expired
            found = await asyncio.gather(a.recover_orphans(), b.recover_orphans())
            assert sorted(found, key=len) == [[], ["s1"]]
            assert [e.event_id for e in await a.replay("s1", 0, 10)] == [1, 2]
            loaded = await a.load("s1")
            assert loaded is not None and loaded.last_turn_status == "interrupted"
            assert loaded.events == 2 and loaded.seq == 2
        finally:
            await b.close()
            await a.close()
            await dead.close()
