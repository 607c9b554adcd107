"""JSON-RPC over WebSocket ``/acp`` (contract.md §7, §8; examples.md §17).

Fixed behaviour (ARCHITECTURE.md §2): requests on one connection run concurrently,
so ``session.cancel`` overtakes a running turn and reaches the upstream.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    FakeUpstream,
    StartBridge,
    provider_env,
    session_params,
    wait_queue_depth,
    wait_until,
)
from xwm_bridge import inflight


async def recv(ws: aiohttp.ClientWebSocketResponse, wait_s: float = 10) -> dict[str, Any]:
    msg = await ws.receive(timeout=wait_s)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    assert msg.data.count("\n") <= 1 and msg.data.rstrip("\n").count("\n") == 0
    decoded: dict[str, Any] = orjson.loads(msg.data)
    return decoded


async def recv_until_id(
    ws: aiohttp.ClientWebSocketResponse, rid: Any, wait_s: float = 10
) -> list[dict[str, Any]]:
    """Every message up to and including the response with id ``rid``."""
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait_s
    while True:
        msg = await recv(ws, max(0.1, deadline - time.monotonic()))
        out.append(msg)
        if "method" not in msg and msg.get("id") == rid:
            return out


def req(method: str, params: dict[str, Any] | None = None, rid: Any = None) -> str:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rid is not None:
        body["id"] = rid
    if params is not None:
        body["params"] = params
    return orjson.dumps(body).decode()


async def test_capabilities_round_trip(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("acp.capabilities", rid="cap-1"))
        reply = await recv(ws)
        assert set(reply) == {"jsonrpc", "id", "result"}
        assert reply["jsonrpc"] == "2.0"
        assert reply["id"] == "cap-1"
        assert reply["result"]["singleAgent"] is True
        assert reply["result"]["multiAgent"] is True
        assert [p["providerId"] for p in reply["result"]["providerCatalog"]] == [
            "codex",
            "opencode",
            "gemini",
        ]
        # binary frames carry requests too
        await ws.send_bytes(req("acp.capabilities", rid=2).encode())
        reply = await recv(ws)
        assert reply["id"] == 2 and "result" in reply


async def test_invalid_frames_answer_parse_error_and_connection_stays_usable(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str("not json")
        reply = await recv(ws)
        assert set(reply) == {"jsonrpc", "id", "error"}
        assert reply["id"] is None
        assert reply["error"]["code"] == -32700
        assert reply["error"]["message"].startswith("invalid json: ")

        await ws.send_str('{"jsonrpc":"2.0","id":5}')
        assert await recv(ws) == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "missing method"},
        }
        await ws.send_str("[1,2]")
        reply = await recv(ws)
        assert reply["error"]["code"] == -32700 and reply["id"] is None

        await ws.send_str(req("xworkmate.providers.sync", rid=9))
        assert await recv(ws) == {
            "jsonrpc": "2.0",
            "id": 9,
            "error": {"code": -32601, "message": "unknown method: xworkmate.providers.sync"},
        }
        await ws.send_str(req("acp.capabilities", rid="after"))
        reply = await recv(ws)
        assert reply["id"] == "after" and reply["result"]["singleAgent"] is True


async def test_notifications_get_no_reply(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("acp.capabilities"))
        await ws.send_str(req("session.close", {"sessionId": "x"}))
        await ws.send_str(req("session.close", {"sessionId": "x"}, rid="last"))
        reply = await recv(ws)
        assert reply == {
            "jsonrpc": "2.0",
            "id": "last",
            "result": {"accepted": True, "closed": False},
        }
        # a reply to either notification would come before the answer to a request sent
        # after all three were handled
        await ws.send_str(req("acp.capabilities", rid="after"))
        after = await recv(ws)
        assert after["id"] == "after" and "result" in after, after


async def test_turn_streams_notifications_then_result(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.start", session_params("ws-1", "hi"), rid="t1"))
        messages = await recv_until_id(ws, "t1")
        started = messages[0]
        assert started["method"] == "session.update"
        assert started["params"]["event"] == "started"
        assert started["params"]["seq"] == 1
        assert started["params"]["sessionId"] == "ws-1"
        deltas = [m["params"]["delta"] for m in messages[1:-1]]
        assert "".join(deltas) == "echo: hi"
        assert messages[-1]["result"]["success"] is True
        assert messages[-1]["result"]["output"] == "echo: hi"
    # the inbound Authorization reached the bridge but is not forwarded upstream verbatim
    assert fake_upstream.state.requests[0]["method"] == "session.start"


async def test_cancel_on_same_socket_overtakes_running_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        began = time.monotonic()
        await ws.send_str(req("session.start", session_params("s1", "slow:3000 hi"), rid="t1"))
        started = await recv(ws)
        assert started["method"] == "session.update"
        assert started["params"]["event"] == "started"
        await wait_until(lambda: "s1" in fake_upstream.state.active)

        await ws.send_str(req("session.cancel", {"sessionId": "s1"}, rid="x1"))
        messages = await recv_until_id(ws, "t1", wait_s=10)
        elapsed = time.monotonic() - began

    responses = [m for m in messages if "method" not in m]
    assert [r["id"] for r in responses] == ["x1", "t1"]  # cancel answered first
    assert responses[0] == {
        "jsonrpc": "2.0",
        "id": "x1",
        "result": {"accepted": True, "cancelled": True},
    }
    turn = responses[1]["result"]
    assert turn["success"] is False
    assert elapsed < 2.5, f"turn was not interrupted ({elapsed:.2f}s)"
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s1"]
    assert fake_upstream.state.completed == 0  # the upstream never finished the turn


async def test_responses_carry_their_ids_when_they_overtake(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    release = fake_upstream.state.holds["a"] = asyncio.Event()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.start", session_params("a", "one"), rid="ta"))
        await ws.send_str(req("session.start", session_params("b", "two"), rid="tb"))
        await ws.send_str(req("acp.capabilities", rid="c"))
        responses: dict[Any, dict[str, Any]] = {}
        order: list[Any] = []
        while len(responses) < 3:
            if len(responses) == 2:  # the other two answered while "ta" is held
                release.set()
            msg = await recv(ws)
            if "method" in msg:
                continue
            responses[msg["id"]] = msg
            order.append(msg["id"])
    assert order[-1] == "ta"  # the held turn of another thread finishes last
    assert set(order) == {"ta", "tb", "c"}
    assert responses["ta"]["result"]["output"] == "echo: one"
    assert responses["tb"]["result"]["output"] == "echo: two"
    assert responses["c"]["result"]["singleAgent"] is True


async def test_turns_of_one_thread_stay_in_order(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    release = fake_upstream.state.holds["q"] = asyncio.Event()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.start", session_params("q", "first"), rid=1))
        await wait_until(lambda: "q" in fake_upstream.state.active)
        await ws.send_str(req("session.message", session_params("q", "second"), rid=2))
        await wait_queue_depth(http, bridge.url, 1)  # "second" waits behind "first"
        release.set()
        results = []
        while len(results) < 2:
            msg = await recv(ws)
            if "method" not in msg:
                results.append(msg)
    assert [r["id"] for r in results] == [1, 2]
    assert [r["result"]["output"] for r in results] == ["echo: first", "echo: second"]


async def test_oversized_message_closes_with_1009(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bridge = await start_bridge(config={"limits": {"max_ws_message_bytes": 1024}}, tmp=tmp_path)
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("acp.capabilities", {"pad": "x" * 500}, rid=1))
        assert (await recv(ws))["id"] == 1  # under the limit: served
        await ws.send_str(req("acp.capabilities", {"pad": "x" * 2048}, rid=2))
        msg = await ws.receive(timeout=5)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), msg
        await asyncio.sleep(0)
        assert ws.close_code == 1009
    # the bridge keeps serving new connections
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("acp.capabilities", rid=3))
        assert (await recv(ws))["id"] == 3


async def test_sigterm_lets_running_turn_finish_then_closes_with_1001(
    start_bridge_process: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge_process(env=provider_env(fake_upstream.url))
    release = fake_upstream.state.holds["g"] = asyncio.Event()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.start", session_params("g", "bye"), rid="t"))
        assert (await recv(ws))["params"]["event"] == "started"
        await wait_until(lambda: "g" in fake_upstream.state.active)
        bridge.proc.send_signal(signal.SIGTERM)
        # the daemon drains: the turn is still running when it starts shutting down
        await wait_until(lambda: any('"msg":"shutting down"' in x for x in bridge.logs), 10)
        release.set()
        messages = await recv_until_id(ws, "t")
        assert messages[-1]["result"]["output"] == "echo: bye"
        closing = await ws.receive(timeout=5)
        assert closing.type == aiohttp.WSMsgType.CLOSE, closing
        assert closing.data == 1001
    # the daemon exits by itself after the drain (a second SIGTERM from stop() could
    # land after the loop removed its handlers and kill it with -15)
    assert await asyncio.wait_for(bridge.proc.wait(), 15) == 0


async def test_requests_past_the_in_flight_limit_are_refused_and_the_socket_stays_usable(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 2)
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    holds = [fake_upstream.state.holds.setdefault(s, asyncio.Event()) for s in ("a", "b")]
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.message", session_params("a", "one"), rid="ta"))
        await ws.send_str(req("session.message", session_params("b", "two"), rid="tb"))
        await wait_until(lambda: {"a", "b"} <= set(fake_upstream.state.active))
        await ws.send_str(req("acp.capabilities", rid="c1"))
        refused = (await recv_until_id(ws, "c1"))[-1]
        assert refused == {
            "jsonrpc": "2.0",
            "id": "c1",
            "error": {
                "code": -32004,
                "message": "too many requests in flight on this connection (limit 2)",
            },
        }
        await ws.send_str(req("acp.capabilities"))  # a notification: refused without a reply
        for hold in holds:
            hold.set()
        done = {m["id"]: m for m in await recv_until_id(ws, "ta") if "method" not in m}
        if "tb" not in done:
            done.update({m["id"]: m for m in await recv_until_id(ws, "tb") if "method" not in m})
        assert done["ta"]["result"]["output"] == "echo: one"
        assert done["tb"]["result"]["output"] == "echo: two"
        await ws.send_str(req("acp.capabilities", rid="c2"))  # room again
        assert "result" in (await recv_until_id(ws, "c2"))[-1]
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    sample = 'xwm_rejected_requests_total{reason="too_many_inflight",transport="ws"} 2.0'
    assert sample in text.splitlines()


async def test_a_cancel_passes_the_in_flight_limit(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 1)
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    fake_upstream.state.holds["a"] = asyncio.Event()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("session.message", session_params("a", "one"), rid="ta"))
        await wait_until(lambda: "a" in fake_upstream.state.active)
        await ws.send_str(req("session.cancel", {"sessionId": "a"}, rid="x"))
        messages = await recv_until_id(ws, "ta")
    answers = {m["id"]: m for m in messages if "method" not in m}
    assert answers["x"]["result"] == {"accepted": True, "cancelled": True}
    assert answers["ta"]["result"]["success"] is False
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["a"]


async def test_bytes_received_counts_bytes_not_characters(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    frame = req("acp.capabilities", {"pad": "é" * 100 + "日本"}, rid=1)
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(frame)
        assert (await recv(ws))["id"] == 1
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    # a text frame is UTF-8 on the wire: 2 bytes for each "é", 3 for each kanji
    sample = f'xwm_bytes_received_total{{transport="ws"}} {float(len(frame.encode()))}'
    assert sample in text.splitlines()
