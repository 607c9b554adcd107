"""The cross-replica thread queue (store/cluster.py) when Redis fails or is away.

A turn's ticket that stays in ``q:<thread>`` after its turn is gone blocks that
thread on every replica for as long as its replica lives (its liveness key keeps
the ticket "held"). These tests make the ticket's release fail against a real
``redis-server`` and check that the thread is usable again once Redis is; and a
Redis that does not answer fails a turn's queueing, its wait, a remote cancel and a
forwarded permission answer as an unavailable store (``-32603 session store
unavailable``, no traceback), not as an internal error.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rex

from tests.conftest import closed_port
from tests.redis_server import RedisServer, redis_server
from xwm_bridge.store.base import StoreLimits, StoreUnavailable
from xwm_bridge.store.cluster import Cluster, Ticket
from xwm_bridge.store.cluster_scripts import RELEASE
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.tasks import wait_for

pytestmark = pytest.mark.asyncio
#: long enough for a retried release (the retry runs every lease_ttl / 3)
GRANTED_WITHIN = 10.0


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
async def admin(redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis.url)
    try:
        yield client
    finally:
        await client.aclose()


async def cluster_on(redis: RedisServer, redis_timeout: float) -> tuple[RedisStore, Cluster]:
    store = RedisStore(redis.url, timeout=redis_timeout, lease_ttl=3.0)
    await store.start()
    cluster = Cluster(store, lambda sid: False)
    await cluster.start()
    return store, cluster


async def close(store: RedisStore, cluster: Cluster) -> None:
    await cluster.close()
    await store.close()


async def test_a_release_redis_refused_is_retried_and_frees_the_thread(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    store, cluster = await cluster_on(redis, redis_timeout=1.0)
    try:
        first = await cluster.enqueue("th", "s1")
        await cluster.acquire(first)
        # the release's pipeline fails (as it does when the connection drops); the
        # heartbeat (SET) and the lease scripts (EVALSHA) still go through
        await admin.execute_command("ACL", "SETUSER", "default", "-eval")
        try:
            await cluster.release(first)
        finally:
            await admin.execute_command("ACL", "SETUSER", "default", "+eval")
        assert store.counters.write_errors >= 1  # the failed release was counted
        second = await cluster.enqueue("th", "s2")
        token = await wait_for(cluster.acquire(second), GRANTED_WITHIN)
        assert token > first.fence
        assert await admin.lrange("xwm:q:th", 0, -1) == [second.value.encode()]
        await cluster.release(second)
    finally:
        await close(store, cluster)


async def test_a_redis_that_does_not_answer_is_an_unavailable_store(
    redis: RedisServer,
) -> None:
    store, cluster = await cluster_on(redis, redis_timeout=0.3)
    where = f"127.0.0.1:{redis.port}"
    try:
        running = await cluster.enqueue("th", "s1")
        await cluster.acquire(running)
        waiting = await cluster.enqueue("th", "s2")  # behind the running one
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match=where):
                await cluster.enqueue("th", "s3")
            with pytest.raises(StoreUnavailable, match=where):
                await wait_for(cluster.acquire(waiting), 5)
            with pytest.raises(StoreUnavailable, match=where):
                await cluster.cancel_remote("s1")
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        await cluster.release(waiting)
        await cluster.release(running)
    finally:
        await close(store, cluster)


async def test_a_redis_that_refuses_the_lease_protocol_is_an_unavailable_store(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    """Redis answering with a refusal of the backend (memory full, a replica after a
    failover, its master down) is an outage like a Redis away: ``StoreUnavailable``
    naming the store and the reply's class, not a raw redis-py error (``-32603
    internal error`` with a traceback). A bug (``WRONGTYPE``) stays one."""
    store, cluster = await cluster_on(redis, redis_timeout=1.0)
    where = f"127.0.0.1:{redis.port}"
    try:
        await admin.config_set("maxmemory-policy", "noeviction")
        await admin.config_set("maxmemory", "1")
        try:
            with pytest.raises(StoreUnavailable, match=r"refused \(OutOfMemoryError\)") as err:
                await cluster.enqueue("th", "s1")
            assert where in str(err.value) and "maxmemory" in str(err.value)
        finally:
            await admin.config_set("maxmemory", "0")
        await admin.config_set("replica-serve-stale-data", "no")
        await admin.execute_command("REPLICAOF", "127.0.0.1", str(closed_port()))
        try:
            with pytest.raises(StoreUnavailable, match="MASTER is down"):
                await cluster.cancel_remote("s1")  # GET run:<sid>: MASTERDOWN
            await admin.config_set("replica-serve-stale-data", "yes")
            with pytest.raises(StoreUnavailable, match=r"refused \(ReadOnlyError\)"):
                await cluster.enqueue("th", "s1")  # the script writes: READONLY
        finally:
            await admin.execute_command("REPLICAOF", "NO", "ONE")
        await admin.set("xwm:q:th", "not a list")  # not the bridge's: a bug, raised as such
        with pytest.raises(rex.ResponseError, match="WRONGTYPE"):
            await cluster.enqueue("th", "s1")
    finally:
        await close(store, cluster)


async def test_a_forwarded_answer_when_redis_does_not_answer_is_an_unavailable_store(
    redis: RedisServer, admin: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's liveness check, and the wait for its reply, are lease-protocol calls
    like the others: a Redis that stops answering fails them as an unavailable store
    within ``store.redis_timeout``, not with a raw redis-py error. Every wait here is
    bounded and the server is resumed in a ``finally``; the server is stopped at the
    moment the reply is awaited (no race with a probe of ``CLIENT LIST``)."""
    store, cluster = await cluster_on(redis, redis_timeout=0.3)
    where = f"127.0.0.1:{redis.port}"
    answer = {"sessionId": "s1", "requestId": "perm-1", "optionId": "once", "by": {}}
    try:
        await wait_for(admin.set("xwm:replica:ghost", "1", px=60_000), 5)  # never replies
        redis.proc.send_signal(signal.SIGSTOP)  # the liveness check finds no answer
        try:
            with pytest.raises(StoreUnavailable, match=where):
                await wait_for(cluster.answer_remote("ghost", answer), 5)
        finally:
            redis.proc.send_signal(signal.SIGCONT)

        blpop = cluster.client.blpop
        popping = asyncio.Event()

        def stopped_then_blpop(*args: Any, **kwargs: Any) -> Any:
            if not popping.is_set():  # published: Redis stops as the reply is awaited
                popping.set()
                redis.proc.send_signal(signal.SIGSTOP)
            return blpop(*args, **kwargs)

        monkeypatch.setattr(cluster.client, "blpop", stopped_then_blpop)
        try:
            with pytest.raises(StoreUnavailable, match=where):
                await wait_for(cluster.answer_remote("ghost", answer), 5)
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert popping.is_set()
        # Redis answers again, the owner does not: the "did not answer" error, in time
        with pytest.raises(TimeoutError, match=r"replica ghost did not answer within 0\.3s"):
            await wait_for(cluster.answer_remote("ghost", answer), 5)
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        await wait_for(close(store, cluster), 10)


async def test_a_ticket_whose_queueing_got_no_answer_does_not_block_the_thread(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    """A turn's queueing that gets no answer in time (Redis stalled, a connection lost
    after the push was sent) fails as an unavailable store, but Redis may still run
    the push: that ticket, of a replica that is alive, headed the thread's queue on
    every replica for as long as this one lived, and no turn ran on it again."""
    store, cluster = await cluster_on(redis, redis_timeout=0.3)
    try:
        await cluster.release(await cluster.enqueue("other", "s0"))  # the script loaded
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                await cluster.enqueue("th", "s1")
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        # Redis ran the push it held: the lost ticket is queued (a one-ticket queue's
        # tail moved to its head, i.e. left as it is, once there is one)
        assert await admin.blmove("xwm:q:th", "xwm:q:th", 5, "RIGHT", "LEFT") is not None
        second = await cluster.enqueue("th", "s2")
        token = await wait_for(cluster.acquire(second), GRANTED_WITHIN)
        assert token > 1
        assert await admin.lrange("xwm:q:th", 0, -1) == [second.value.encode()]
        await cluster.release(second)
    finally:
        await close(store, cluster)


async def test_the_keys_of_a_thread_s_lease_expire(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    """Every key a turn's lease writes expires: the fencing token and its holder key
    had no expiry, two keys per thread ever used, kept in Redis for ever. They last
    as long as the records they fence (``store.retention``), refreshed by every grant."""
    store, cluster = await cluster_on(redis, redis_timeout=1.0)
    try:
        for session in ("s1", "s2"):  # granted at once, then after a wait at the head
            first = await cluster.enqueue("th", session)
            second = await cluster.enqueue("th", session)
            await cluster.acquire(first)
            await cluster.release(first)
            await cluster.acquire(second)
            await cluster.release(second)
        assert int(await admin.get("xwm:fence:th")) == 4
        retention_ms = StoreLimits().retention * 1000
        for raw in await admin.keys("xwm:*"):
            name = raw.decode()
            if name.startswith(("xwm:replica:", "xwm:schema", "xwm:health:")):
                continue
            assert 0 < await admin.pttl(name) <= retention_ms, name
        assert await admin.pttl("xwm:fence:th") > retention_ms - 60_000
    finally:
        await close(store, cluster)


async def test_a_session_stays_marked_running_while_another_of_its_turns_runs_here(
    redis: RedisServer, admin: aioredis.Redis
) -> None:
    """Two turns of one session on two threads, both running on this replica: the
    first's release deleted ``run:<session>`` while the second still ran, so a
    ``session.cancel`` arriving at another replica found nothing to cancel."""
    store, cluster = await cluster_on(redis, redis_timeout=1.0)
    other_store, other = await cluster_on(redis, redis_timeout=1.0)
    try:
        first = await cluster.enqueue("th-a", "s1")
        second = await cluster.enqueue("th-b", "s1")
        await cluster.acquire(first)
        await cluster.acquire(second)
        await cluster.release(first)
        assert await admin.get("xwm:run:s1") == store.replica_id.encode()
        assert await other.cancel_remote("s1") is True  # published to this replica
        await cluster.release(second)
        assert await admin.get("xwm:run:s1") is None
        # a release owed for a queueing that failed does not take the mark either
        third = await cluster.enqueue("th-a", "s1")
        await cluster.acquire(third)
        keys, args = cluster._release_call(Ticket("th-c", "lost", "s1"))
        await admin.eval(RELEASE, len(keys), *keys, *args)
        assert await admin.get("xwm:run:s1") == store.replica_id.encode()
        await cluster.release(third)
        assert await admin.get("xwm:run:s1") is None
    finally:
        await close(other_store, other)
        await close(store, cluster)
