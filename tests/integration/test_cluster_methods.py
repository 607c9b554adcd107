"""session.close and session.cancel of a replica on Redis (store/cluster.py) when Redis
is away, and session.close of a session only the store holds."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    closed_port,
    rpc,
    session_params,
)
from tests.redis_server import RedisServer, redis_server

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


async def replicas(
    start_bridge: StartBridge, redis: RedisServer, upstream: FakeUpstream, tmp: Path, n: int
) -> list[Any]:
    """``n`` bridges in this process on one Redis (one environment: in-process daemons
    share it)."""
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        XWM_SESSION_STORE="redis",
        XWM_REDIS_URL=redis.url,
        XWM_PROVIDER_CODEX_URL=upstream.url,
    )
    config = {"store": {"redis_timeout": 0.5}}
    return [await start_bridge(env=env, config=config, tmp=tmp) for _ in range(n)]


async def stop(redis: RedisServer) -> None:
    redis.proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(redis.proc.wait(), 10)


UNAVAILABLE = {"code": -32603, "message": "session store unavailable"}


async def test_close_and_cancel_with_redis_away_close_here_and_say_the_store_is_away(
    start_bridge: StartBridge,
    redis: RedisServer,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """Redis refusing (a replica whose master is down) or stopped: the local close
    happens all the same; the other replicas cannot be told, nor the stored record
    deleted, so the answer is the documented unavailable store (a warning, no
    traceback), never ``-32603 internal error``; and the session is gone from here."""
    (bp,) = await replicas(start_bridge, redis, fake_upstream, tmp_path, 1)
    for sid in ("c1", "c2"):
        reply = await rpc(http, bp.rpc_url, "session.start", session_params(sid))
        assert reply["result"]["success"] is True
        assert bp.bridge.sessions.get(sid) is not None
    admin = aioredis.Redis.from_url(redis.url)
    try:
        await admin.config_set("replica-serve-stale-data", "no")
        await admin.execute_command("REPLICAOF", "127.0.0.1", str(closed_port()))
        try:  # every read refused: MASTERDOWN
            closed = await rpc(http, bp.rpc_url, "session.close", {"sessionId": "c1"})
            assert closed["error"] == UNAVAILABLE
            assert bp.bridge.sessions.get("c1") is None  # closed here all the same
            cancelled = await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "c1"})
            assert cancelled["error"] == UNAVAILABLE
        finally:
            await admin.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        await admin.aclose()
    await stop(redis)
    closed = await rpc(http, bp.rpc_url, "session.close", {"sessionId": "c2"})
    assert closed["error"] == UNAVAILABLE
    assert bp.bridge.sessions.get("c2") is None
    cancelled = await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "c2"})
    assert cancelled["error"] == UNAVAILABLE
    logs = "\n".join(bp.logs)
    assert "MASTER is down" in logs and "Connection refused" in logs
    assert "internal error" not in logs and "method failed" not in logs


async def test_closing_on_a_replica_that_never_loaded_the_session_says_closed(
    start_bridge: StartBridge,
    redis: RedisServer,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """A session whose turns ran on A, closed through B (which never loaded it): its
    record existed, so ``closed`` is true (contract.md §11.4), and it is gone from the
    store; it was ``closed: false`` although the close deleted it."""
    a, b = await replicas(start_bridge, redis, fake_upstream, tmp_path, 2)
    reply = await rpc(http, a.rpc_url, "session.start", session_params("held-by-a"))
    assert reply["result"]["success"] is True
    assert b.bridge.sessions.get("held-by-a") is None
    closed = await rpc(http, b.rpc_url, "session.close", {"sessionId": "held-by-a"})
    assert closed["result"] == {"accepted": True, "closed": True}
    assert await b.bridge.store.load("held-by-a") is None
    again = await rpc(http, b.rpc_url, "session.close", {"sessionId": "held-by-a"})
    assert again["result"] == {"accepted": True, "closed": False}  # nothing left
