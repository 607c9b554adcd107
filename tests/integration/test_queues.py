"""Per-thread FIFO queues, cross-thread parallelism, bounded queue depth and reaping.

Spec: contract.md §12.1-§12.2; design ARCHITECTURE.md §2 (bounded queue answered at once,
idle sessions reaped after a TTL). Timing is measured against the fake upstream's latency
with generous margins.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    eventually,
    log_entries,
    provider_env,
    read_metric,
    rpc,
    session_params,
    sse,
    updates,
    wait_queue_depth,
    wait_until,
)

LATENCY_MS = 300


def limits_config(upstream_url: str, **limits: Any) -> dict[str, Any]:
    return {
        "providers": [{"id": "codex", "label": "Codex", "endpoint": upstream_url}],
        "limits": limits,
    }


class ActiveMonitor:
    """Records how many turns the fake upstream executes at once, at the moment each one
    starts (the fake adds a turn to ``state.active`` when it begins): exact, not sampled."""

    def __init__(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self.max_active = 0
        self.overlaps: list[list[str]] = []

    def saw(self, active: list[str]) -> None:
        self.max_active = max(self.max_active, len(active))
        if len(active) > 1:
            self.overlaps.append(active)

    def __enter__(self) -> ActiveMonitor:
        self.fake.state.active = _Observed(self, self.fake.state.active)
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.state.active = dict(self.fake.state.active)


class _Observed(dict[str, asyncio.Event]):
    def __init__(self, monitor: ActiveMonitor, initial: dict[str, asyncio.Event]) -> None:
        super().__init__(initial)
        self.monitor = monitor

    def __setitem__(self, key: str, value: asyncio.Event) -> None:
        super().__setitem__(key, value)
        self.monitor.saw(sorted(self))


async def test_one_thread_runs_turns_one_at_a_time_in_order(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.state.latency_ms = LATENCY_MS
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    finished: list[int] = []
    release = fake_upstream.state.holds["s-fifo-0"] = asyncio.Event()

    async def turn(i: int) -> dict[str, Any]:
        # distinct sessions on one thread, so the fake can tell overlapping turns apart
        params = session_params(f"s-fifo-{i}", f"turn {i}", threadId="t-fifo")
        reply = await rpc(http, bridge.rpc_url, "session.start", params, rid=i)
        finished.append(i)
        return reply

    with ActiveMonitor(fake_upstream) as monitor:
        started = time.monotonic()
        tasks = []
        for i in range(4):
            tasks.append(asyncio.create_task(turn(i)))
            # fix the arrival order: the first turn runs, each later one waits behind it
            if i == 0:
                await wait_until(lambda: "s-fifo-0" in fake_upstream.state.active)
            else:
                await wait_queue_depth(http, bridge.url, i)
        release.set()
        replies = await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started

    assert [r["result"]["output"] for r in replies] == [f"echo: turn {i}" for i in range(4)]
    assert finished == [0, 1, 2, 3]
    assert [r["params"]["sessionId"] for r in fake_upstream.state.requests] == [
        f"s-fifo-{i}" for i in range(4)
    ]
    assert elapsed >= 4 * LATENCY_MS / 1000 * 0.95, elapsed
    assert monitor.max_active == 1, monitor.overlaps


async def test_different_threads_run_in_parallel(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.state.latency_ms = LATENCY_MS
    bridge = await start_bridge(env=provider_env(fake_upstream.url))

    async def turn(i: int) -> dict[str, Any]:
        params = session_params(f"s-par-{i}", f"par {i}", threadId=f"t-par-{i}")
        return await rpc(http, bridge.rpc_url, "session.start", params)

    with ActiveMonitor(fake_upstream) as monitor:
        started = time.monotonic()
        replies = await asyncio.gather(*(turn(i) for i in range(4)))
        elapsed = time.monotonic() - started

    assert all(r["result"]["success"] is True for r in replies)
    assert elapsed < 4 * LATENCY_MS / 1000 * 0.75, elapsed  # serial would take ≥ 1.2 s
    assert monitor.max_active >= 2


async def test_same_session_turns_are_serialized_and_keep_seq_order(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.state.latency_ms = 150
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    params = session_params("s-same", "first")
    release = fake_upstream.state.holds["s-same"] = asyncio.Event()
    first = asyncio.create_task(sse(http, bridge.rpc_url, "session.start", params))
    await wait_until(lambda: "s-same" in fake_upstream.state.active)
    rest = []
    for i in range(3):
        rest.append(
            asyncio.create_task(
                sse(http, bridge.rpc_url, "session.message", {**params, "taskPrompt": f"m{i}"})
            )
        )
        await wait_queue_depth(http, bridge.url, i + 1)  # arrival order: m0, m1, m2
    release.set()
    streams = [await first, *[await t for t in rest]]
    seqs = [updates(events)[0]["seq"] for events in streams]
    assert seqs == [1, 2, 3, 4]
    assert [s[-1]["result"]["output"] for s in streams] == [
        "echo: first",
        "echo: m0",
        "echo: m1",
        "echo: m2",
    ]


async def test_queue_overflow_is_refused_at_once(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bridge = await start_bridge(
        config=limits_config(fake_upstream.url, max_queue_depth=2), tmp=tmp_path
    )
    url = bridge.rpc_url

    def on_thread(sid: str, prompt: str) -> dict[str, Any]:
        return session_params(sid, prompt, threadId="t-full")

    release = fake_upstream.state.holds["a"] = asyncio.Event()
    running = asyncio.create_task(rpc(http, url, "session.start", on_thread("a", "running")))
    await wait_until(lambda: "a" in fake_upstream.state.active)

    async def queue_depth() -> float:
        async with http.get(f"{bridge.url}/metrics") as resp:
            line = next(
                x for x in (await resp.text()).splitlines() if x.startswith("xwm_queue_depth ")
            )
        return float(line.split()[1])

    waiting = []
    for n, sid in enumerate(("b", "c"), 1):  # one after the other: FIFO order is then known
        waiting.append(
            asyncio.create_task(rpc(http, url, "session.start", on_thread(sid, f"wait {sid}")))
        )
        await wait_queue_depth(http, bridge.url, n)
    assert not running.done() and not any(t.done() for t in waiting)

    started = time.monotonic()
    refused = await rpc(http, url, "session.start", on_thread("d", "overflow"), rid="over")
    assert time.monotonic() - started < 0.5
    assert refused["id"] == "over"
    assert refused["error"]["code"] == -32004
    assert "queue is full" in refused["error"]["message"]
    assert "result" not in refused

    # another thread is unaffected while this one is full
    other = await rpc(http, url, "session.start", session_params("e", "other", threadId="t-ok"))
    assert other["result"]["output"] == "echo: other"
    assert not running.done()

    release.set()
    first = await running
    assert first["result"]["success"] is True
    assert [(await t)["result"]["output"] for t in waiting] == ["echo: wait b", "echo: wait c"]
    sessions = [r["params"]["sessionId"] for r in fake_upstream.state.requests]
    assert sessions == ["a", "e", "b", "c"]  # "d" never reached the upstream

    # once drained, the thread accepts turns again
    again = await rpc(http, url, "session.start", on_thread("d", "later"))
    assert again["result"]["output"] == "echo: later"


async def alive(http: aiohttp.ClientSession, base_url: str, n: int) -> bool:
    """Whether the daemon holds ``n`` session records in memory."""
    return await read_metric(http, base_url, "xwm_sessions_alive") == n


async def test_idle_session_is_reaped(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bridge = await start_bridge(
        config=limits_config(fake_upstream.url, session_idle_ttl=0.5), tmp=tmp_path
    )
    url = bridge.rpc_url
    for sid in ("s-fresh", "s-idle"):
        reply = await rpc(http, url, "session.start", session_params(sid, "hi"))
        assert reply["result"]["success"] is True
    closed = await rpc(http, url, "session.close", {"sessionId": "s-fresh"})
    assert closed["result"] == {"accepted": True, "closed": True}  # not yet idle

    # the reaper forgets "s-idle" once it has been idle for the TTL
    await eventually(lambda: alive(http, bridge.url, 0), within=10)
    closed = await rpc(http, url, "session.close", {"sessionId": "s-idle"})
    # reaped from memory, its record kept in the store: it existed (contract.md §11.4)
    assert closed["result"] == {"accepted": True, "closed": True}
    # a reaped session's next message starts fresh
    events = await sse(http, url, "session.message", session_params("s-idle", "back"))
    assert updates(events)[0]["seq"] == 1
    assert events[-1]["result"]["output"] == "echo: back"


async def test_session_not_reaped_while_running_or_queued(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bridge = await start_bridge(
        config=limits_config(fake_upstream.url, session_idle_ttl=0.5), tmp=tmp_path
    )
    url = bridge.rpc_url
    # "run" runs (held by the fake) and "queued" waits behind it on the same thread ...
    release = fake_upstream.state.holds["run"] = asyncio.Event()
    run = asyncio.create_task(
        sse(http, url, "session.start", session_params("run", "long", threadId="t-r"))
    )
    await wait_until(lambda: "run" in fake_upstream.state.active)
    queued_start = await rpc(http, url, "session.start", session_params("queued", "x"))
    assert queued_start["result"]["success"] is True
    queued = asyncio.create_task(
        sse(http, url, "session.message", session_params("queued", "later", threadId="t-r"))
    )
    await wait_queue_depth(http, bridge.url, 1)
    # ... while a session last used after both of them is reaped: by then both have been
    # idle for longer than the TTL, and only running or waiting keeps them
    touched = await rpc(http, url, "session.start", session_params("idle", "x", threadId="t-i"))
    assert touched["result"]["success"] is True
    assert await read_metric(http, bridge.url, "xwm_sessions_alive") == 3
    await eventually(lambda: alive(http, bridge.url, 2), within=10)
    assert not run.done() and not queued.done()
    release.set()
    run_events = await run
    assert run_events[-1]["result"]["success"] is True
    queued_events = await queued
    assert updates(queued_events)[0]["seq"] == 2  # the session survived its wait in the queue
    events = await sse(http, url, "session.message", session_params("run", "next"))
    assert updates(events)[0]["seq"] == 2  # and "run" survived its long turn
    assert events[-1]["result"]["output"] == "echo: next"
    closed = await rpc(http, url, "session.close", {"sessionId": "idle"})
    assert closed["result"] == {"accepted": True, "closed": True}  # reaped, still stored


async def test_fifty_concurrent_threads_all_succeed(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.state.latency_ms = 100
    bridge = await start_bridge(env=provider_env(fake_upstream.url))

    async def turn(i: int) -> dict[str, Any]:
        params = session_params(f"s-many-{i}", f"n{i}", threadId=f"t-many-{i}")
        return await rpc(http, bridge.rpc_url, "session.start", params, rid=i)

    started = time.monotonic()
    replies = await asyncio.wait_for(asyncio.gather(*(turn(i) for i in range(50))), 20)
    elapsed = time.monotonic() - started
    for i, reply in enumerate(replies):
        assert reply["id"] == i
        assert reply["result"]["success"] is True, reply
        assert reply["result"]["output"] == f"echo: n{i}"
    assert len(fake_upstream.state.requests) == 50
    assert elapsed < 50 * 0.1 / 2, elapsed  # far from serial (5 s)


async def test_burst_within_default_depth_is_accepted(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """The default depth (32 waiting) is generous enough for a burst of 20."""
    bridge = await start_bridge(
        env=base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=fake_upstream.url)
    )
    replies = await asyncio.gather(
        *(
            rpc(
                http,
                bridge.rpc_url,
                "session.start",
                session_params(f"b{i}", f"burst {i}", threadId="t-burst"),
            )
            for i in range(20)
        )
    )
    assert all(r["result"]["success"] is True for r in replies)


def audited(lines: list[str], session_id: str, outcome: str) -> list[dict[str, Any]]:
    """The audit lines of ``session_id``'s requests that ended with ``outcome``."""
    return [
        e
        for e in log_entries(lines)
        if e.get("audit") and e.get("session_id") == session_id and e.get("outcome") == outcome
    ]


@pytest.mark.parametrize("transport", ["ws", "http"])
async def test_queued_turn_of_departed_client_is_skipped(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    transport: str,
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    release = fake_upstream.state.holds["keep"] = asyncio.Event()
    keep = asyncio.create_task(
        rpc(http, url, "session.start", session_params("keep", "keep", threadId="t-gone"))
    )
    await wait_until(lambda: "keep" in fake_upstream.state.active)
    gone_params = session_params("gone", "never sent", threadId="t-gone")
    if transport == "ws":
        async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
            frame = {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": gone_params}
            await ws.send_str(orjson.dumps(frame).decode())
            await wait_queue_depth(http, bridge.url, 1)  # queued behind "keep"
    else:
        gone = asyncio.create_task(rpc(http, url, "session.start", gone_params))
        await wait_queue_depth(http, bridge.url, 1)
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
    # "keep" goes on once the bridge has seen the client of "gone" leave
    await wait_until(lambda: bool(audited(bridge.logs, "gone", "abandoned")))
    release.set()
    assert (await keep)["result"]["success"] is True
    after = await rpc(http, url, "session.start", session_params("after", "x", threadId="t-gone"))
    assert after["result"]["success"] is True
    assert [r["params"]["sessionId"] for r in fake_upstream.state.requests] == ["keep", "after"]


async def test_refused_session_start_has_no_effect(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """An overflowing session.start is refused before it resets the session record."""
    bridge = await start_bridge(
        config=limits_config(fake_upstream.url, max_queue_depth=1), tmp=tmp_path
    )
    url = bridge.rpc_url
    first = await sse(http, url, "session.start", session_params("x", "one", threadId="t-x"))
    assert updates(first)[0]["seq"] == 1
    release = fake_upstream.state.holds["busy"] = asyncio.Event()
    running = asyncio.create_task(
        rpc(http, url, "session.start", session_params("busy", "busy", threadId="t-x"))
    )
    await wait_until(lambda: "busy" in fake_upstream.state.active)
    waiting = asyncio.create_task(
        rpc(http, url, "session.start", session_params("w", "wait", threadId="t-x"))
    )
    await wait_queue_depth(http, bridge.url, 1)  # the one place is taken
    refused = await rpc(http, url, "session.start", session_params("x", "two", threadId="t-x"))
    assert refused["error"]["code"] == -32004
    release.set()
    await running
    await waiting
    events = await sse(http, url, "session.message", session_params("x", "three", threadId="t-x"))
    assert updates(events)[0]["seq"] == 2  # the refused start did not reset "x"


async def test_zero_queue_depth_still_runs_turns_on_idle_threads(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """max_queue_depth: 0 means "nothing may wait", not "nothing may run"."""
    bridge = await start_bridge(
        config=limits_config(fake_upstream.url, max_queue_depth=0), tmp=tmp_path
    )
    url = bridge.rpc_url
    release = fake_upstream.state.holds["z1"] = asyncio.Event()
    running = asyncio.create_task(
        rpc(http, url, "session.start", session_params("z1", "running", threadId="t-z"))
    )
    await wait_until(lambda: "z1" in fake_upstream.state.active)
    refused = await rpc(http, url, "session.start", session_params("z2", "x", threadId="t-z"))
    assert refused["error"]["code"] == -32004
    release.set()
    assert (await running)["result"]["success"] is True
    again = await rpc(http, url, "session.start", session_params("z3", "y", threadId="t-z"))
    assert again["result"]["output"] == "echo: y"


async def test_queued_session_start_resets_when_its_turn_runs(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """Issue 15 item 1: message A runs, message B and start C wait. B continues A's
    session (seq after A's); the reset belongs to C's turn (seq restarts at 1)."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    params = session_params("s-reset", "a")
    release = fake_upstream.state.holds["s-reset"] = asyncio.Event()
    a = asyncio.create_task(sse(http, url, "session.message", params))
    await wait_until(lambda: "s-reset" in fake_upstream.state.active)
    b = asyncio.create_task(sse(http, url, "session.message", {**params, "taskPrompt": "b"}))
    await wait_queue_depth(http, bridge.url, 1)
    c = asyncio.create_task(sse(http, url, "session.start", {**params, "taskPrompt": "c"}))
    await wait_queue_depth(http, bridge.url, 2)
    release.set()
    a_seqs = [u["seq"] for u in updates(await a)]
    b_seqs = [u["seq"] for u in updates(await b)]
    c_seqs = [u["seq"] for u in updates(await c)]
    assert b_seqs[0] == a_seqs[-1] + 1, (a_seqs, b_seqs)  # B kept A's session
    assert c_seqs[0] == 1, c_seqs  # C's turn reset it
    replay = await rpc(http, url, "session.replay", {"sessionId": "s-reset"})
    turn_ids = {u["turnId"] for u in updates(replay["result"]["notifications"])}
    assert len(turn_ids) == 1  # only C's turn is left in the ledger


async def test_queued_session_start_of_departed_client_is_refused_and_audited(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """A queued session.start whose caller left is neither run nor applied (no reset),
    and the audit log says so."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    first = await sse(http, url, "session.start", session_params("s-left", "one"))
    last_seq = updates(first)[-1]["seq"]
    release = fake_upstream.state.holds["s-left"] = asyncio.Event()
    keep = asyncio.create_task(
        rpc(http, url, "session.message", session_params("s-left", "running"))
    )
    await wait_until(lambda: "s-left" in fake_upstream.state.active)
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        frame = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "session.start",
            "params": session_params("s-left", "never sent"),
        }
        await ws.send_str(orjson.dumps(frame).decode())
        await wait_queue_depth(http, bridge.url, 1)

    def skipped() -> list[dict[str, Any]]:
        return [
            e
            for e in log_entries(bridge.logs)
            if e.get("audit") and e.get("method") == "session.start" and e.get("transport") == "ws"
        ]

    await wait_until(lambda: bool(skipped()))  # the bridge saw the client leave
    release.set()
    assert (await keep)["result"]["success"] is True
    events = await sse(http, url, "session.message", session_params("s-left", "three"))
    assert updates(events)[0]["seq"] > last_seq + 1  # not reset by the departed start
    prompts = [r["params"]["taskPrompt"] for r in fake_upstream.state.requests]
    assert "never sent" not in prompts
    assert [(e["session_id"], e["outcome"]) for e in skipped()] == [("s-left", "abandoned")]
