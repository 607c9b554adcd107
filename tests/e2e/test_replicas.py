"""Two daemons on one real Redis (issue 6): per-thread FIFO across replicas under
concurrent load, cancel and a permission answer through the other replica, a replica
killed mid-queue.

Needs ``redis-server`` (apt; installed by ``.ci/run``): skipped locally when it is
missing, failing when CI=true.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from tests.conftest import (
    TOKEN,
    BridgeProcess,
    FakeUpstream,
    ServeApp,
    StartBridge,
    base_env,
    eventually,
    rpc,
    session_params,
    updates,
    wait_until,
)
from tests.integration.agent_helpers import agent_params, agent_provider
from tests.redis_server import RedisServer, redis_server

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e]
LEASE_TTL = 1.5


@pytest.fixture
async def redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    async with redis_server(tmp_path) as server:
        yield server


async def two_replicas(
    start_bridge: StartBridge, redis: RedisServer, upstream_url: str, tmp: Path
) -> tuple[BridgeProcess, BridgeProcess]:
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        XWM_SESSION_STORE="redis",
        XWM_REDIS_URL=redis.url,
        XWM_PROVIDER_CODEX_URL=upstream_url,
        XWM_PROVIDER_OPENCODE_URL=upstream_url,
        XWM_PROVIDER_GEMINI_URL=upstream_url,
    )
    cfg = {"store": {"lease_ttl": LEASE_TTL}, "limits": {"max_queue_depth": 64}}
    a = await start_bridge(env=env, config=cfg, tmp=tmp)
    b = await start_bridge(env=env, config=cfg, tmp=tmp)
    return a, b


async def tickets(redis: RedisServer, thread: str) -> int:
    """How many turns hold a place in ``thread``'s cross-replica queue (store/cluster.py:
    the Redis list ``xwm:q:<thread>``, running head included)."""
    client = aioredis.Redis.from_url(redis.url)
    try:
        return int(await client.llen(f"xwm:q:{thread}"))
    finally:
        await client.aclose()


async def wait_tickets(redis: RedisServer, thread: str, n: int) -> None:
    async def enough() -> bool:
        return await tickets(redis, thread) >= n

    await eventually(enough, within=20)


def timing_upstream(
    log: list[dict[str, Any]],
    inflight: dict[str, int],
    peak: dict[str, int],
    gate: asyncio.Event,
) -> web.Application:
    """Holds each turn until ``gate`` is set, then 150 ms, and records when it ran and how
    many of its thread overlapped."""

    async def handle(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        params = body.get("params", {})
        thread = str(params.get("threadId") or params.get("sessionId"))
        inflight[thread] = inflight.get(thread, 0) + 1
        peak[thread] = max(peak.get(thread, 0), inflight[thread])
        peak["*"] = max(peak.get("*", 0), sum(inflight.values()))
        try:
            await gate.wait()
            start = time.monotonic()
            await asyncio.sleep(0.15)  # the upstream's work
        finally:
            inflight[thread] -= 1
        log.append({"thread": thread, "prompt": params.get("taskPrompt"), "start": start})
        result = {"success": True, "output": f"done {params.get('taskPrompt')}"}
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": result})

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    return app


async def test_per_thread_fifo_across_two_replicas_under_concurrent_load(
    start_bridge: StartBridge,
    redis: RedisServer,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    log: list[dict[str, Any]] = []
    inflight: dict[str, int] = {}
    peak: dict[str, int] = {}
    gate = asyncio.Event()
    base = await serve_app(timing_upstream(log, inflight, peak, gate))
    a, b = await two_replicas(start_bridge, redis, base, tmp_path)
    threads, turns = ["t-a", "t-b", "t-c"], 8

    async def client(thread: str, i: int) -> dict[str, Any]:
        replica = (a, b)[(i + threads.index(thread)) % 2]
        method = "session.start" if i == 0 else "session.message"
        reply = await rpc(http, replica.rpc_url, method, session_params(thread, f"{thread}#{i}"))
        return dict(reply["result"])

    async def submit(thread: str) -> list[asyncio.Task[dict[str, Any]]]:
        """Turn i is sent once turn i - 1 holds its place in the thread's queue (the first
        one runs on the held upstream, so the queue only grows): arrival order is i."""
        sent = []
        for i in range(turns):
            sent.append(asyncio.get_running_loop().create_task(client(thread, i)))
            await wait_tickets(redis, thread, i + 1)
        return sent

    # the three threads submit at once, each alternating between the replicas
    sent = await asyncio.wait_for(asyncio.gather(*(submit(t) for t in threads)), 60)
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(*(t for ts in sent for t in ts)), 60)
    assert all(r["success"] is True for r in results), results
    for thread in threads:
        ran = [e["prompt"] for e in log if e["thread"] == thread]
        assert ran == [f"{thread}#{i}" for i in range(turns)]  # arrival order, both replicas
        assert peak[thread] == 1  # never two turns of one thread at once
    assert peak["*"] > 1  # while different threads ran in parallel
    # seq continued across replicas: one session, strictly increasing, no duplicates
    replay = (await rpc(http, a.rpc_url, "session.replay", {"sessionId": "t-a"}))["result"]
    seqs = [u["seq"] for u in updates(replay["notifications"])]
    assert seqs == list(range(1, turns + 1))


async def test_cancel_sent_to_the_other_replica_stops_the_turn(
    start_bridge: StartBridge,
    redis: RedisServer,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    a, b = await two_replicas(start_bridge, redis, fake_upstream.url, tmp_path)
    turn = asyncio.get_running_loop().create_task(
        rpc(http, a.rpc_url, "session.start", session_params("x1", "slow:30000 long"))
    )
    await wait_until(lambda: "x1" in fake_upstream.state.active, within=10)
    started = time.monotonic()
    reply = await rpc(http, b.rpc_url, "session.cancel", {"sessionId": "x1"})
    assert reply["result"] == {"accepted": True, "cancelled": True}
    result = (await asyncio.wait_for(turn, 10))["result"]
    assert result["success"] is False and result["cancelled"] is True
    assert time.monotonic() - started < 8
    assert fake_upstream.state.cancels  # the upstream was told too
    # nothing running anywhere now: a second cancel finds nothing
    again = await rpc(http, b.rpc_url, "session.cancel", {"sessionId": "x1"})
    assert again["result"]["cancelled"] is False


async def test_close_sent_to_the_other_replica_stops_the_turn_and_keeps_nothing(
    start_bridge: StartBridge,
    redis: RedisServer,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """session.close on B of a session whose turn runs on A: the turn is cancelled (as a
    close on A would), and nothing of it stays in the store: not its late notifications
    and result, not the record its end would save again (the session came back, history
    and all, until retention)."""
    a, b = await two_replicas(start_bridge, redis, fake_upstream.url, tmp_path)
    sid = "closed-elsewhere"
    fake_upstream.state.holds[sid] = asyncio.Event()  # the turn runs until it is cancelled
    unwind = fake_upstream.state.cancel_holds[sid] = asyncio.Event()
    turn = asyncio.get_running_loop().create_task(
        rpc(http, a.rpc_url, "session.start", session_params(sid, "long"))
    )
    await wait_until(lambda: sid in fake_upstream.state.active, within=10)
    reply = await rpc(http, b.rpc_url, "session.close", {"sessionId": sid})
    assert reply["result"] == {"accepted": True, "closed": True}
    # A cancels its turn: the upstream is told (its answer held: A's turn still ends)
    await wait_until(lambda: any(c["sessionId"] == sid for c in fake_upstream.state.cancels))
    del fake_upstream.state.holds[sid]  # later turns of the id answer at once
    unwind.set()
    result = (await asyncio.wait_for(turn, 10))["result"]
    assert result["success"] is False and result["cancelled"] is True

    # what A wrote after the close is not kept: no record, no ledger, on either replica
    for replica in (a, b):
        replay = await rpc(http, replica.rpc_url, "session.replay", {"sessionId": sid})
        assert replay["result"]["notifications"] == []
    client = aioredis.Redis.from_url(redis.url)
    try:
        assert await client.exists(f"xwm:s:{sid}", f"xwm:l:{sid}", f"xwm:t:{sid}") == 0
    finally:
        await client.aclose()
    # and the id starts afresh on either replica
    fresh = await rpc(http, a.rpc_url, "session.message", session_params(sid, "again"))
    assert fresh["result"]["success"] is True
    replay = await rpc(http, b.rpc_url, "session.replay", {"sessionId": sid})
    assert [u["seq"] for u in updates(replay["result"]["notifications"])] == [1]  # fresh


async def test_killing_a_replica_mid_queue_loses_no_queued_turn(
    start_bridge_process: StartBridge,
    redis: RedisServer,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    a, b = await two_replicas(start_bridge_process, redis, fake_upstream.url, tmp_path)
    first = asyncio.get_running_loop().create_task(
        rpc(http, a.rpc_url, "session.start", session_params("k1", "slow:60000 stuck"))
    )
    await wait_until(lambda: "k1" in fake_upstream.state.active, within=10)
    running = (await rpc(http, b.rpc_url, "session.replay", {"sessionId": "k1"}))["result"]
    assert running["lastTurnStatus"] == "running"
    queued = []
    for i in range(3):  # each one in place before the next, so their order is known
        queued.append(
            asyncio.get_running_loop().create_task(
                rpc(http, b.rpc_url, "session.message", session_params("k1", f"queued {i}"), rid=i)
            )
        )
        await wait_tickets(redis, "k1", i + 2)  # its place in the cross-replica queue
    assert await tickets(redis, "k1") == 4  # a's running turn, then the three
    assert not any(t.done() for t in queued)  # they wait for replica a's turn
    killed = time.monotonic()
    await a.stop(signal.SIGKILL)
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(first, 10)
    results = [r["result"] for r in await asyncio.wait_for(asyncio.gather(*queued), 30)]
    assert all(r["success"] is True for r in results), results
    assert time.monotonic() - killed < LEASE_TTL + 10
    assert all(f"queued {i}" in r["output"] for i, r in enumerate(results)), results
    prompts = [r["params"].get("taskPrompt") for r in fake_upstream.state.requests]
    assert prompts[-3:] == [f"queued {i}" for i in range(3)]  # in order, after the dead turn
    replay = (await rpc(http, b.rpc_url, "session.replay", {"sessionId": "k1"}))["result"]
    notes = updates(replay["notifications"])
    interrupted = [u for u in notes if u.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0]["turnId"] == running["lastTurnId"]
    seqs = [u["seq"] for u in notes]
    assert seqs == sorted(set(seqs))  # no seq reused after the takeover


async def test_a_permission_raised_on_one_replica_is_answered_through_the_other(
    start_bridge: StartBridge, redis: RedisServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The answer used to reach only the replica it was sent to: "no pending permission
    request" there, and the turn on the other waited for its deadline."""
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_SESSION_STORE="redis", XWM_REDIS_URL=redis.url)
    cfg = {
        "store": {"lease_ttl": LEASE_TTL},
        "providers": [agent_provider()],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 20},
    }
    a = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    b = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    target = tmp_path / "granted.txt"
    params = agent_params("rp1", f"permission {target}", workingDirectory=str(tmp_path))
    turn = asyncio.get_running_loop().create_task(rpc(http, a.rpc_url, "session.start", params))

    async def listed_on_b() -> list[dict[str, Any]]:
        reply = await rpc(http, b.rpc_url, "permission.list", {})
        requests: list[dict[str, Any]] = reply["result"]["requests"]
        return requests

    [asked] = await eventually(listed_on_b, within=20)
    answer = {"sessionId": "rp1", "requestId": asked["requestId"], "optionId": "once"}
    reply = await rpc(http, b.rpc_url, "session.permission", answer)
    assert reply["result"]["accepted"] is True and reply["result"]["outcome"] == "allow_once"
    result = (await asyncio.wait_for(turn, 20))["result"]
    assert "permission granted (once)" in result["output"] and target.exists()
    assert result["permissions"][0]["answeredBy"]["transport"] == "http"
    # a second answer, through either replica, loses
    for bridge in (b, a):
        late = await rpc(
            http, bridge.rpc_url, "session.permission", {**answer, "optionId": "reject"}
        )
        assert late["error"]["code"] == -32602, late


async def test_an_answer_to_another_clients_request_is_not_forwarded(
    start_bridge: StartBridge, redis: RedisServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A stored request names the principal whose turn raised it: another client's
    answer is refused here (-32003), not forwarded to the replica holding it, also when
    no session names an owner any more (closed while its turn is being cancelled)."""
    from tests.integration.test_security import TOKEN_A, TOKEN_B, call
    from xwm_bridge.core.principals import principal_of
    from xwm_bridge.store.records import PermissionRecord

    env = base_env(
        XWM_CLIENT_TOKENS=f"{TOKEN_A},{TOKEN_B}",
        XWM_SESSION_STORE="redis",
        XWM_REDIS_URL=redis.url,
    )
    bp = await start_bridge(env=env, config={"store": {"redis_timeout": 1}}, tmp=tmp_path)
    client = aioredis.Redis.from_url(redis.url)
    try:
        alice = principal_of(f"Bearer {TOKEN_A}")[0]
        record = PermissionRecord(
            "gs2", "perm-8", created_at=time.time(), owner="ghost", principal=alice
        )
        await client.set("xwm:replica:ghost", "1", px=60_000)
        await client.hset("xwm:p:gs2", "perm-8", record.dumps())
        await client.sadd("xwm:perms", "gs2")
        answer = {"sessionId": "gs2", "requestId": "perm-8", "optionId": "once"}
        reply = await asyncio.wait_for(
            call(http, bp.rpc_url, TOKEN_B, "session.permission", answer), 10
        )
        assert reply.get("error") == {
            "code": -32003,
            "message": "session belongs to another client",
        }
        # its own client's answer is forwarded (and the ghost does not reply)
        reply = await asyncio.wait_for(
            call(http, bp.rpc_url, TOKEN_A, "session.permission", answer), 10
        )
        assert "held by replica ghost, which did not answer" in reply["error"]["message"]
    finally:
        await client.aclose()


async def test_an_answer_for_a_replica_that_does_not_reply_fails_in_time(
    start_bridge: StartBridge, redis: RedisServer, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A stored request of a live replica id that nobody serves: -32603 naming it after
    ``store.redis_timeout``, not a hang."""
    from xwm_bridge.store.records import PermissionRecord

    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_SESSION_STORE="redis", XWM_REDIS_URL=redis.url)
    bp = await start_bridge(env=env, config={"store": {"redis_timeout": 1}}, tmp=tmp_path)
    client = aioredis.Redis.from_url(redis.url)
    try:
        record = PermissionRecord("gs1", "perm-9", created_at=time.time(), owner="ghost")
        await client.set("xwm:replica:ghost", "1", px=60_000)  # "alive", but not listening
        await client.hset("xwm:p:gs1", "perm-9", record.dumps())
        await client.sadd("xwm:perms", "gs1")
        answer = {"sessionId": "gs1", "requestId": "perm-9", "optionId": "once"}
        started = time.monotonic()
        reply = await asyncio.wait_for(rpc(http, bp.rpc_url, "session.permission", answer), 10)
        assert reply["error"]["code"] == -32603, reply
        assert "held by replica ghost, which did not answer" in reply["error"]["message"]
        assert time.monotonic() - started < 5
    finally:
        await client.aclose()


async def test_an_answer_forwarded_while_redis_stops_answering_is_an_unavailable_store(
    start_bridge: StartBridge,
    redis: RedisServer,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis stopping while the asker waits for the owner's reply is the outage it is
    (``-32603 session store unavailable``, a warning without a traceback), as for any
    other request; it was ``held by replica ghost, which did not answer: TimeoutError``
    with the raw redis-py error. The server stops as the reply is awaited (no race with
    a probe), every wait is bounded, and it is resumed in a ``finally``."""
    from xwm_bridge.store.records import PermissionRecord

    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_SESSION_STORE="redis", XWM_REDIS_URL=redis.url)
    bp = await start_bridge(env=env, config={"store": {"redis_timeout": 1}}, tmp=tmp_path)
    client = aioredis.Redis.from_url(redis.url, socket_timeout=5)
    try:
        record = PermissionRecord("gs3", "perm-7", created_at=time.time(), owner="ghost")
        await client.set("xwm:replica:ghost", "1", px=60_000)  # "alive", never replies
        await client.hset("xwm:p:gs3", "perm-7", record.dumps())
        await client.sadd("xwm:perms", "gs3")
        cluster = bp.bridge.cluster
        blpop = cluster.client.blpop
        popping = asyncio.Event()

        def stopped_then_blpop(*args: Any, **kwargs: Any) -> Any:
            if not popping.is_set():  # published: Redis stops as the reply is awaited
                popping.set()
                redis.proc.send_signal(signal.SIGSTOP)
            return blpop(*args, **kwargs)

        monkeypatch.setattr(cluster.client, "blpop", stopped_then_blpop)
        answer = {"sessionId": "gs3", "requestId": "perm-7", "optionId": "once"}
        try:
            reply = await asyncio.wait_for(rpc(http, bp.rpc_url, "session.permission", answer), 10)
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        assert popping.is_set()
        assert reply["error"] == {"code": -32603, "message": "session store unavailable"}
        logs = "\n".join(bp.logs)
        assert "Traceback" not in logs and "did not answer within 1s" in logs
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        await client.aclose()
