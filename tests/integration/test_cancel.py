"""session.cancel / session.close against running turns (contract.md §11.3-§11.4,
forwarding.md §8, examples.md §10), including the fix that a cancel reaches the upstream
and overtakes a running turn on the same WebSocket (ARCHITECTURE.md §2)."""

from __future__ import annotations

import asyncio
import contextlib
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
    provider_env,
    rpc,
    session_params,
    sse,
    updates,
    wait_queue_depth,
    wait_until,
)

CANCELLED_UPDATE = {
    "type": "status",
    "event": "completed",
    "message": "turn cancelled",
    "pending": False,
    "error": True,
}


def assert_cancelled_stream(events: list[Any], session_id: str) -> dict[str, Any]:
    """started (seq 1) → completed-error "turn cancelled" (seq 2) → cancelled result."""
    started, failed = updates(events)
    assert started["event"] == "started" and started["seq"] == 1
    assert failed == {
        "sessionId": session_id,
        "threadId": session_id,
        "turnId": started["turnId"],
        "seq": 2,
        **CANCELLED_UPDATE,
    }
    assert (
        events.index(next(e for e in events if isinstance(e, dict) and e.get("params") == failed))
        < len(events) - 1
    )
    result: dict[str, Any] = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "turn cancelled"
    assert result["cancelled"] is True
    assert result["mode"] == "single-agent"
    assert result["provider"] == "codex"
    assert result["turnId"] == started["turnId"]
    assert result["resolvedProviderId"] == "codex"
    return result


async def start_slow_turn(
    http: aiohttp.ClientSession, url: str, fake: FakeUpstream, session_id: str, ms: int = 5000
) -> asyncio.Task[list[Any]]:
    task = asyncio.create_task(
        sse(http, url, "session.start", session_params(session_id, f"slow:{ms}"))
    )
    await wait_until(lambda: session_id in fake.state.active)
    return task


async def test_cancel_mid_turn_over_http(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(
        env=provider_env(fake_upstream.url, INTERNAL_SERVICE_TOKEN="svc-cancel")
    )
    url = bridge.rpc_url
    turn = await start_slow_turn(http, url, fake_upstream, "session-1")
    began = time.monotonic()
    reply = await rpc(http, url, "session.cancel", {"sessionId": "session-1"}, rid="c1")
    assert reply == {"jsonrpc": "2.0", "id": "c1", "result": {"accepted": True, "cancelled": True}}

    events = await asyncio.wait_for(turn, 5)
    assert time.monotonic() - began < 2.5  # not the 5 s the upstream would have taken
    assert_cancelled_stream(events, "session-1")

    # the upstream was told, with the bridge's own credential
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["session-1"]
    [cancel_request] = [r for r in fake_upstream.state.requests if r["method"] == "session.cancel"]
    headers = {k.lower(): v for k, v in cancel_request["headers"].items()}
    assert headers["authorization"] == "Bearer svc-cancel"
    # and its turn is over (aborted by the closed request and/or the cancel)
    await wait_until(lambda: "session-1" not in fake_upstream.state.active)

    # nothing is running any more
    again = await rpc(http, url, "session.cancel", {"sessionId": "session-1"})
    assert again["result"] == {"accepted": True, "cancelled": False}

    # the next turn on the same session works and continues seq
    events = await sse(http, url, "session.message", session_params("session-1", "after"))
    assert updates(events)[0]["seq"] == 3
    assert events[-1]["result"]["success"] is True
    assert events[-1]["result"]["output"] == "echo: after"


async def test_cancel_idle_or_unknown_session(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    assert (await rpc(http, url, "session.start", session_params("idle")))["result"]["success"]
    for sid in ("idle", "unknown"):
        reply = await rpc(http, url, "session.cancel", {"sessionId": sid})
        assert reply["result"] == {"accepted": True, "cancelled": False}
    assert fake_upstream.state.cancels == []


async def test_close_cancels_running_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    turn = await start_slow_turn(http, url, fake_upstream, "s-close")
    reply = await rpc(http, url, "session.close", {"sessionId": "s-close"})
    assert reply["result"] == {"accepted": True, "closed": True}
    events = await asyncio.wait_for(turn, 5)
    assert_cancelled_stream(events, "s-close")
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s-close"]

    # the record is gone: the next message is a fresh session
    events = await sse(http, url, "session.message", session_params("s-close", "fresh"))
    assert updates(events)[0]["seq"] == 1
    assert events[-1]["result"]["output"] == "echo: fresh"


async def test_cancel_only_hits_the_running_turn_not_a_queued_one(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    release = fake_upstream.state.holds["qa"] = asyncio.Event()
    running = asyncio.create_task(
        rpc(http, url, "session.start", session_params("qa", "running", threadId="t-q"))
    )
    await wait_until(lambda: "qa" in fake_upstream.state.active)
    queued = asyncio.create_task(
        rpc(http, url, "session.start", session_params("qb", "queued", threadId="t-q"))
    )
    await wait_queue_depth(http, bridge.url, 1)  # "qb" waits behind "qa"
    reply = await rpc(http, url, "session.cancel", {"sessionId": "qb"})
    assert reply["result"] == {"accepted": True, "cancelled": False}
    release.set()
    assert (await running)["result"]["success"] is True  # the running one was not touched
    assert (await queued)["result"]["output"] == "echo: queued"
    assert fake_upstream.state.cancels == []


async def test_cancel_with_websocket_upstream(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=fake_upstream.ws_url)
    bridge = await start_bridge(env=env)
    url = bridge.rpc_url
    turn = await start_slow_turn(http, url, fake_upstream, "s-wsc")
    began = time.monotonic()
    reply = await rpc(http, url, "session.cancel", {"sessionId": "s-wsc"})
    assert reply["result"] == {"accepted": True, "cancelled": True}
    events = await asyncio.wait_for(turn, 5)
    assert time.monotonic() - began < 2.5
    assert_cancelled_stream(events, "s-wsc")
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s-wsc"]
    assert all(r["transport"] == "ws" for r in fake_upstream.state.requests)
    await wait_until(lambda: "s-wsc" not in fake_upstream.state.active)

    events = await sse(http, url, "session.message", session_params("s-wsc", "after ws"))
    assert events[-1]["result"]["output"] == "echo: after ws"


async def test_cancel_overtakes_turn_on_same_bridge_websocket(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        start = {
            "jsonrpc": "2.0",
            "id": "turn",
            "method": "session.start",
            "params": session_params("s-bws", "slow:5000"),
        }
        await ws.send_str(orjson.dumps(start).decode())
        await wait_until(lambda: "s-bws" in fake_upstream.state.active)
        cancel = {"jsonrpc": "2.0", "id": "c", "method": "session.cancel"}
        cancel["params"] = {"sessionId": "s-bws"}
        await ws.send_str(orjson.dumps(cancel).decode())

        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(5):
            while not frames or frames[-1].get("id") != "turn":
                frames.append(orjson.loads((await ws.receive()).data))

    ids = [f.get("id") for f in frames if "id" in f]
    assert ids == ["c", "turn"]  # the cancel answered before the turn ended
    cancel_reply = next(f for f in frames if f.get("id") == "c")
    assert cancel_reply["result"] == {"accepted": True, "cancelled": True}
    assert_cancelled_stream(frames, "s-bws")


async def test_client_disconnect_does_not_cancel_running_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """A running turn keeps going in its thread worker when its HTTP caller goes away;
    only an explicit session.cancel / session.close stops it."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    turn = await start_slow_turn(http, url, fake_upstream, "s-gone", ms=600)
    turn.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await turn
    await wait_until(lambda: fake_upstream.state.completed == 1)
    assert fake_upstream.state.cancels == []
    events = await sse(http, url, "session.message", session_params("s-gone", "next"))
    assert updates(events)[0]["seq"] == 2
    assert events[-1]["result"]["output"] == "echo: next"


async def test_restart_while_running_keeps_the_cancel_handle(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """contract.md §15.3: in the original a session.start during a running turn lost that
    turn's cancel handle. Here the running turn stays cancellable."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    old = await start_slow_turn(http, url, fake_upstream, "s-re")
    new = asyncio.create_task(sse(http, url, "session.start", session_params("s-re", "new")))
    await wait_queue_depth(http, url.rsplit("/acp/rpc", 1)[0], 1)  # reset and queued
    reply = await rpc(http, url, "session.cancel", {"sessionId": "s-re"})
    assert reply["result"] == {"accepted": True, "cancelled": True}
    assert_cancelled_stream(await asyncio.wait_for(old, 5), "s-re")
    events = await asyncio.wait_for(new, 5)
    [started] = updates(events)
    assert started["seq"] == 1
    assert events[-1]["result"]["output"] == "echo: new"


async def test_cancel_reaches_both_turns_of_a_session_running_on_two_threads(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """The queue key is threadId (contract.md §12), so one session can run a turn on each
    of two threads at once: session.cancel cancels both, not only the newer one."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    turns = [
        asyncio.create_task(
            rpc(http, url, "session.message", session_params("two", "slow:20000", threadId=t))
        )
        for t in ("t-a", "t-b")
    ]

    def started() -> int:
        return sum(
            r["params"].get("sessionId") == "two"
            for r in fake_upstream.state.requests
            if r["method"] == "session.message"
        )

    await wait_until(lambda: started() == 2)
    reply = await rpc(http, url, "session.cancel", {"sessionId": "two"})
    assert reply["result"] == {"accepted": True, "cancelled": True}
    done, pending = await asyncio.wait(turns, timeout=10)
    for task in pending:
        task.cancel()
    assert not pending, "a turn of the session was not cancelled"
    for task in done:
        assert task.result()["result"]["cancelled"] is True
    again = await rpc(http, url, "session.cancel", {"sessionId": "two"})
    assert again["result"] == {"accepted": True, "cancelled": False}
