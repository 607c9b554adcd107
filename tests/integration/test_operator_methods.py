"""Operator methods (issue 13) against the real daemon and the fake upstream:
``session.list`` / ``session.get`` / ``bridge.watch`` / ``bridge.health`` /
``bridge.config`` on HTTP, SSE, WebSocket and stdio, under the same auth."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from tests.conftest import (
    AUTH,
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    eventually,
    provider_env,
    rpc,
    session_params,
    sse,
    wait_until,
)
from tests.integration.test_websocket import recv, req


async def turn(
    http: aiohttp.ClientSession, url: str, sid: str, prompt: str = "hi", **kw: Any
) -> Any:
    reply = await rpc(http, url, "session.start", session_params(sid, prompt, **kw))
    return reply["result"]


async def test_list_filters_paging_and_last_turn(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    before = time.time()
    await turn(http, bp.rpc_url, "s-a", "one", threadId="t-1")
    await turn(http, bp.rpc_url, "s-b", "error")  # the fake answers a JSON-RPC error
    await turn(http, bp.rpc_url, "s-c", "three", threadId="t-1")
    listed = (await rpc(http, bp.rpc_url, "session.list", {}))["result"]
    ids = [s["sessionId"] for s in listed["sessions"]]
    assert ids == ["s-c", "s-b", "s-a"]  # newest first
    row = listed["sessions"][0]
    assert row["threadId"] == "t-1" and row["provider"] == "codex" and row["state"] == "completed"
    last = row["lastTurn"]
    assert last["status"] == "completed" and last["provider"] == "codex"
    assert last["prompt"] == "three" and last["startedAt"] >= before
    assert last["finishedAt"] >= last["startedAt"] and last["durationMs"] is not None
    assert "model" in last and "usage" in last
    assert listed["watchCursor"]

    failed = (await rpc(http, bp.rpc_url, "session.list", {"state": "failed"}))["result"]
    assert [s["sessionId"] for s in failed["sessions"]] == ["s-b"]
    assert failed["sessions"][0]["lastTurn"]["error"]
    thread = (await rpc(http, bp.rpc_url, "session.list", {"threadId": "t-1"}))["result"]
    assert [s["sessionId"] for s in thread["sessions"]] == ["s-c", "s-a"]
    none = (await rpc(http, bp.rpc_url, "session.list", {"provider": "gemini"}))["result"]
    assert none["sessions"] == []
    later = await rpc(http, bp.rpc_url, "session.list", {"updatedSince": time.time() + 60})
    assert later["result"]["sessions"] == []

    page1 = (await rpc(http, bp.rpc_url, "session.list", {"limit": 2}))["result"]
    assert [s["sessionId"] for s in page1["sessions"]] == ["s-c", "s-b"]
    assert page1["nextCursor"]
    page2 = (
        await rpc(http, bp.rpc_url, "session.list", {"limit": 2, "cursor": page1["nextCursor"]})
    )["result"]
    assert [s["sessionId"] for s in page2["sessions"]] == ["s-a"]
    assert page2["nextCursor"] is None

    for bad in ({"state": "sleepy"}, {"limit": 0}, {"cursor": "not-a-cursor"}, {"threadId": 3}):
        err = await rpc(http, bp.rpc_url, "session.list", bad)
        assert err["error"]["code"] == -32602, bad


async def test_get_returns_turns_with_results(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await turn(http, bp.rpc_url, "g1", "first")
    second = await rpc(http, bp.rpc_url, "session.message", session_params("g1", "second"))
    got = (await rpc(http, bp.rpc_url, "session.get", {"sessionId": "g1"}))["result"]
    assert got["session"]["sessionId"] == "g1" and got["history"] == ["first", "second"]
    turns = got["turns"]
    assert [t["prompt"] for t in turns] == ["first", "second"]
    assert turns[1]["result"]["output"] == "echo: second"
    assert turns[1]["result"]["success"] is True
    assert turns[1]["turnId"] == second["result"].get("turnId") or turns[1]["turnId"]
    assert got["permissions"] == []
    missing = await rpc(http, bp.rpc_url, "session.get", {"sessionId": "nope"})
    assert missing["error"]["code"] == -32602
    assert (await rpc(http, bp.rpc_url, "session.get", {}))["error"]["code"] == -32602


async def watchers(http: aiohttp.ClientSession, rpc_url: str, n: int) -> bool:
    """Whether ``n`` watches follow the live feed (``bridge.health``)."""
    health = (await rpc(http, rpc_url, "bridge.health", {}))["result"]
    return bool(health["metrics"]["watchers"] == n)


async def test_watch_long_poll_since_cursor_misses_nothing(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    cursor = (await rpc(http, bp.rpc_url, "session.list", {}))["result"]["watchCursor"]
    # the watcher is away while a turn runs (streamed to its own client over SSE)
    await sse(http, bp.rpc_url, "session.start", session_params("w1", "while away"))
    got = (
        await rpc(http, bp.rpc_url, "bridge.watch", {"since": cursor, "kinds": ["turn", "session"]})
    )["result"]
    assert got["reset"] is False
    kinds = [(e["kind"], e["type"]) for e in got["events"]]
    assert ("session", "started") in kinds
    assert kinds.count(("turn", "started")) == 1 and kinds.count(("turn", "finished")) == 1
    deltas = "".join(
        (e["update"] or {}).get("delta", "") for e in got["events"] if e["type"] == "update"
    )
    assert deltas == "echo: while away"
    seqs = [e["seq"] for e in got["events"]]
    assert seqs == sorted(seqs)
    # nothing new: the long poll waits, then returns the same cursor
    again = (
        await rpc(
            http,
            bp.rpc_url,
            "bridge.watch",
            {"since": got["cursor"], "waitMs": 200, "kinds": ["turn"]},
        )
    )["result"]
    assert again["events"] == [] and again["cursor"] == got["cursor"]
    # a long poll wakes up for a new event
    poll = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "bridge.watch", {"since": got["cursor"], "kinds": ["turn"]})
    )
    await eventually(lambda: watchers(http, bp.rpc_url, 1))  # the long poll is waiting
    await turn(http, bp.rpc_url, "w2", "wake")
    woke = (await asyncio.wait_for(poll, 10))["result"]
    assert woke["events"][0]["sessionId"] == "w2"
    # a cursor of another process (or garbage) is a reset / an error
    stale = await rpc(http, bp.rpc_url, "bridge.watch", {"since": "deadbeef:5", "waitMs": 0})
    assert stale["result"]["reset"] is True
    bad = await rpc(http, bp.rpc_url, "bridge.watch", {"since": "x"})
    assert bad["error"]["code"] == -32602
    bad = await rpc(http, bp.rpc_url, "bridge.watch", {"kinds": ["nope"]})
    assert bad["error"]["code"] == -32602


async def test_plain_http_turn_streams_to_a_live_watcher(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    """A turn whose client takes plain JSON still streams upstream while someone watches."""
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(bp.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("bridge.watch", {"kinds": ["turn"]}, rid="w"))
        assert (await recv(ws))["params"]["type"] == "live"
        await turn(http, bp.rpc_url, "pj", "plain json")
        text = ""
        while True:
            e = (await recv(ws))["params"]
            if e["type"] == "update":
                text += (e["update"] or {}).get("delta", "")
            if e["type"] == "finished":
                break
    assert text == "echo: plain json"


async def test_watch_streams_over_websocket_and_sse(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(bp.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("bridge.watch", {"kinds": ["turn"]}, rid="w"))
        live = await recv(ws)
        assert live["method"] == "bridge.event" and live["params"]["type"] == "live"
        await turn(http, bp.rpc_url, "ws-1", "streamed")
        seen: list[dict[str, Any]] = []
        while not any(e["type"] == "finished" for e in seen):
            msg = await recv(ws)
            assert msg["method"] == "bridge.event"
            seen.append(msg["params"])
        assert seen[0]["type"] == "started" and seen[0]["sessionId"] == "ws-1"
        assert seen[-1]["status"] == "completed"
    # SSE: a bounded watch returns its cursor when it ends
    events = await sse(
        http, bp.rpc_url, "bridge.watch", {"since": seen[0]["cursor"], "maxSeconds": 0.3}
    )
    notes = [e["params"] for e in events[:-1]]
    assert [n["type"] for n in notes if n.get("kind") == "turn"][-1] == "finished"
    assert events[-1]["result"]["reason"] == "timeout"
    assert events[-1]["result"]["cursor"] == seen[-1]["cursor"] or events[-1]["result"]["cursor"]


async def test_operator_methods_need_the_token_and_config_is_masked(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    env = provider_env(fake_upstream.url, INTERNAL_SERVICE_TOKEN="upstream-secret-xyz")
    bp = await start_bridge(env=env)
    for method in (
        "session.list",
        "permission.list",
        "bridge.watch",
        "bridge.health",
        "bridge.config",
    ):
        body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
        async with http.post(bp.rpc_url, data=body, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401, method
    cfg = (await rpc(http, bp.rpc_url, "bridge.config", {}))["result"]
    text = orjson.dumps(cfg).decode()
    assert TOKEN not in text and "upstream-secret-xyz" not in text
    assert cfg["config"]["auth_token"] == "********"
    assert cfg["config"]["internal_service_token"] == "********"
    health = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
    assert {"providers", "agents", "gateways", "queues", "metrics", "samples"} <= set(health)
    assert {p["id"] for p in health["providers"]} >= {"codex"}
    caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
    assert "bridge.watch" in caps["operator"]["methods"]


async def test_watch_with_a_garbled_cursor_is_invalid_params(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge()
    for since in ("e:\u00b2", "e:" + "9" * 5000):  # isdigit() passes them, int() does not
        reply = await rpc(http, bp.rpc_url, "bridge.watch", {"since": since, "waitMs": 0})
        assert reply["error"]["code"] == -32602, reply
        assert "since must be a cursor" in reply["error"]["message"]
    assert not [line for line in bp.logs if "Traceback" in line]


async def test_health_reports_provider_outcomes_and_samples(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    fake_upstream: FakeUpstream,
    tmp_path: Any,
) -> None:
    bp = await start_bridge(
        env=provider_env(fake_upstream.url),
        config={"console": {"health_interval": 0.1}},
        tmp=tmp_path,
    )
    await turn(http, bp.rpc_url, "h1", "error")

    async def sampled() -> dict[str, Any] | None:  # two samples, the last one after the turn
        got: dict[str, Any] = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
        samples = got["samples"]
        return got if len(samples) >= 2 and samples[-1]["metrics"]["requests"] >= 1 else None

    health = await eventually(sampled)
    codex = next(p for p in health["providers"] if p["id"] == "codex")
    assert codex["state"] == "failing" and codex["failures"] == 1 and codex["lastError"]
    assert len(health["samples"]) >= 2
    assert health["samples"][-1]["metrics"]["requests"] >= 1
    await turn(http, bp.rpc_url, "h2", "fine")
    health = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
    codex = next(p for p in health["providers"] if p["id"] == "codex")
    assert codex["state"] == "ok" and codex["turns"] == 2


async def test_health_tracks_configured_providers_after_client_chosen_names(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    """Turns that route to no provider carry the client's own ``provider`` string; the
    health view's book of provider outcomes (bounded at MAX_PROVIDERS) filled up with
    them, and a configured provider first used afterwards stayed "unknown" for good."""
    from xwm_bridge.app.health import MAX_PROVIDERS

    bp = await start_bridge(env=provider_env(fake_upstream.url))
    route = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}
    for i in range(MAX_PROVIDERS):
        params = {"sessionId": f"hx{i}", "taskPrompt": "hi", "provider": f"chosen-{i}"}
        await rpc(http, bp.rpc_url, "session.start", {**params, "routing": route})
    await turn(http, bp.rpc_url, "hc", "fine")
    health = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
    codex = next(p for p in health["providers"] if p["id"] == "codex")
    assert codex["state"] == "ok" and codex["turns"] == 1


async def test_session_list_over_stdio(fake_upstream: FakeUpstream, tmp_path: Any) -> None:
    """Every transport: the methods answer on acp-stdio too."""
    import sys

    from tests.conftest import ROOT

    env = base_env(XWM_PROVIDER_CODEX_URL=fake_upstream.url)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "acp-stdio",
        env=env, cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": session_params("io1")},
        {"jsonrpc": "2.0", "id": 2, "method": "bridge.watch", "params": {"kinds": ["session"]}},
    ]
    for line in lines:
        proc.stdin.write(orjson.dumps(line) + b"\n")
    await proc.stdin.drain()
    got: dict[Any, Any] = {}
    while 1 not in got:
        msg = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        got[msg.get("id")] = msg
    proc.stdin.write(orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": "session.list"}) + b"\n")
    await proc.stdin.drain()
    while 3 not in got:
        msg = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        got[msg.get("id")] = msg
    assert [s["sessionId"] for s in got[3]["result"]["sessions"]] == ["io1"]
    proc.stdin.close()  # end of input ends the open watch too: the process exits
    while 2 not in got:
        line = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert line, "stdout closed before the watch answered"
        msg = orjson.loads(line)
        got[msg.get("id")] = msg
    assert got[2]["result"]["reason"] == "disconnected"
    assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_a_running_turn_is_listed_and_got_while_it_runs(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    """A running turn's record lives in memory until it ends (one store write per turn):
    session.list and session.get still show it, as running."""
    from tests.conftest import wait_until

    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await turn(http, bp.rpc_url, "s-run", "first")
    slow = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "session.message", session_params("s-run", "slow:20000 long"))
    )
    await wait_until(lambda: "s-run" in fake_upstream.state.active)
    got = (await rpc(http, bp.rpc_url, "session.get", {"sessionId": "s-run"}))["result"]
    assert [(t["prompt"], t["status"]) for t in got["turns"]] == [
        ("first", "completed"),
        ("slow:20000 long", "running"),
    ]
    assert got["session"]["state"] == "running"
    assert got["session"]["lastTurn"]["status"] == "running"
    listed = (await rpc(http, bp.rpc_url, "session.list", {}))["result"]
    (row,) = [s for s in listed["sessions"] if s["sessionId"] == "s-run"]
    assert row["running"] is True and row["lastTurn"]["prompt"] == "slow:20000 long"
    await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "s-run"})
    assert (await asyncio.wait_for(slow, 10))["result"]["cancelled"] is True
    got = (await rpc(http, bp.rpc_url, "session.get", {"sessionId": "s-run"}))["result"]
    assert [t["status"] for t in got["turns"]] == ["completed", "cancelled"]


async def test_a_long_poll_with_no_cursor_watches_from_now(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    fake_upstream: FakeUpstream,
    tmp_path: Any,
) -> None:
    """No ``since``: the recent metric samples, and a cursor at the head, as the streaming
    watch's ``live`` one (it was the last sample's: the next poll replayed every event
    between that sample and the first poll, all from before the watcher came)."""
    bp = await start_bridge(
        env=provider_env(fake_upstream.url),
        config={"console": {"health_interval": 3600}},
        tmp=tmp_path,
    )

    async def sampled() -> bool:  # the one sample, taken at start (the next is an hour off)
        health = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
        return bool(health["samples"])

    await eventually(sampled)  # bridge.health's watchCursor: turn events are recorded now
    await turn(http, bp.rpc_url, "before", "before the watcher")
    first = (await rpc(http, bp.rpc_url, "bridge.watch", {"waitMs": 0}))["result"]
    assert [e["kind"] for e in first["events"]] == ["metrics"] and first["reset"] is False
    assert first["more"] is False
    later = (await rpc(http, bp.rpc_url, "bridge.watch", {"since": first["cursor"], "waitMs": 0}))[
        "result"
    ]
    assert later["events"] == [], [(e["kind"], e["type"]) for e in later["events"]]
    # and a new event after it still comes
    poll = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "bridge.watch", {"since": later["cursor"], "kinds": ["turn"]})
    )
    await eventually(lambda: watchers(http, bp.rpc_url, 1))
    await turn(http, bp.rpc_url, "after", "after it")
    woke = (await asyncio.wait_for(poll, 10))["result"]
    assert {e["sessionId"] for e in woke["events"]} == {"after"}


async def test_a_streaming_watch_sees_the_turns_the_drain_lets_finish(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    """A shutdown drains running turns for up to ``shutdown_grace``; a streaming watch
    ended with ``reason: shutdown`` as the drain began, so the operator never saw how
    the turns it was draining ended. Now it streams until no turn runs, then ends."""
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    running = asyncio.create_task(turn(http, bp.rpc_url, "drained", "slow:1500 finish me"))
    await wait_until(lambda: bp.bridge.sessions.running_count() == 1)
    watch = asyncio.create_task(sse(http, bp.rpc_url, "bridge.watch", {"kinds": ["turn"]}))
    await wait_until(lambda: bp.bridge.events.subscribers == 1)
    stopping = asyncio.create_task(bp.stop())
    events = await asyncio.wait_for(watch, 15)
    notes = [e["params"] for e in events[:-1] if e.get("method") == "bridge.event"]
    finished = [n for n in notes if n.get("type") == "finished"]
    assert [n["sessionId"] for n in finished] == ["drained"], notes
    assert finished[0]["status"] == "completed"
    assert events[-1]["result"]["reason"] == "shutdown"
    assert (await asyncio.wait_for(running, 15))["success"] is True
    await asyncio.wait_for(stopping, 15)
