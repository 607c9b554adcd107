"""SSE streaming mode of ``POST /acp/rpc`` (contract.md §6, §12.4, §13; examples.md §4)."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson

from tests.conftest import AUTH, FakeUpstream, StartBridge, provider_env, session_params

SSE_HEADERS = {**AUTH, "Accept": "text/event-stream"}
STARTED_KEYS = {
    "sessionId",
    "threadId",
    "turnId",
    "seq",
    "type",
    "event",
    "message",
    "pending",
    "error",
}
TURN_ID = re.compile(r"^turn-\d+$")


async def post_sse(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with http.post(url, data=data, headers=headers or SSE_HEADERS) as resp:
        return resp.status, resp.headers, await resp.read()


def split_events(raw: bytes) -> list[Any]:
    """Strictly parse ``data: <compact json>\\n\\n`` events; '[DONE]' kept as a string."""
    assert raw.endswith(b"\n\n"), raw[-200:]
    blocks = raw[:-2].split(b"\n\n")
    events: list[Any] = []
    for block in blocks:
        assert block.startswith(b"data: "), block
        payload = block[len(b"data: ") :]
        assert b"\n" not in payload and b"\r" not in payload, block
        if payload == b"[DONE]":
            events.append("[DONE]")
            continue
        decoded = orjson.loads(payload)
        assert orjson.dumps(decoded) == payload, f"not compact JSON: {payload!r}"
        events.append(decoded)
    return events


def request(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        body["params"] = params
    if rid is not None:
        body["id"] = rid
    return body


async def test_sse_headers_and_single_result_event(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, headers, raw = await post_sse(http, bridge.rpc_url, request("acp.capabilities"))
    assert status == 200
    assert headers["Content-Type"].split(";")[0].strip() == "text/event-stream"
    assert headers["Cache-Control"] == "no-cache"
    assert headers["X-Accel-Buffering"] == "no"
    events = split_events(raw)
    assert len(events) == 1
    assert events[0]["id"] == 1
    assert events[0]["result"]["singleAgent"] is True
    assert b"[DONE]" not in raw


async def test_accept_header_match_is_case_insensitive_substring(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    headers = {**AUTH, "Accept": "application/json, TEXT/Event-Stream;q=0.9"}
    status, resp_headers, raw = await post_sse(
        http, bridge.rpc_url, request("acp.capabilities"), headers
    )
    assert status == 200
    assert resp_headers["Content-Type"].startswith("text/event-stream")
    assert split_events(raw)[0]["id"] == 1


async def test_id_less_request_ends_with_done(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, _, raw = await post_sse(http, bridge.rpc_url, request("acp.capabilities", rid=None))
    assert status == 200
    assert raw == b"data: [DONE]\n\n"


async def test_method_error_is_the_final_event(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    status, _, raw = await post_sse(
        http, bridge.rpc_url, request("xworkmate.providers.sync", rid="u1")
    )
    assert status == 200
    assert split_events(raw) == [
        {
            "jsonrpc": "2.0",
            "id": "u1",
            "error": {"code": -32601, "message": "unknown method: xworkmate.providers.sync"},
        }
    ]
    status, _, raw = await post_sse(
        http,
        bridge.rpc_url,
        request("session.message", {"sessionId": "s1", "taskPrompt": "hi"}, rid="e2"),
    )
    assert status == 200
    assert split_events(raw) == [
        {"jsonrpc": "2.0", "id": "e2", "error": {"code": -32602, "message": "ROUTING_REQUIRED"}}
    ]
    # an id-less failing request still ends with the sentinel and nothing else
    status, _, raw = await post_sse(http, bridge.rpc_url, request("session.cancel", {}, rid=None))
    assert raw == b"data: [DONE]\n\n"


async def test_pre_dispatch_errors_are_not_streamed(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, headers, raw = await post_sse(http, bridge.rpc_url, b"{oops")
    assert status == 400
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(raw)["error"]["code"] == -32700
    status, headers, raw = await post_sse(
        http, bridge.rpc_url, request("acp.capabilities"), {"Accept": "text/event-stream"}
    )
    assert status == 401
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(raw)["error"]["code"] == -32001


async def test_turn_stream_started_update_relayed_deltas_then_result(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    params = session_params("sse-1", "hello world", threadId="thread-9")
    status, _, raw = await post_sse(http, bridge.rpc_url, request("session.start", params, "t1"))
    assert status == 200
    events = split_events(raw)
    assert "[DONE]" not in events

    started = events[0]
    assert set(started) == {"jsonrpc", "method", "params"}
    assert started["method"] == "session.update"
    assert set(started["params"]) == STARTED_KEYS
    first_turn_id = started["params"]["turnId"]
    assert TURN_ID.match(first_turn_id), first_turn_id
    assert started["params"] == {
        "sessionId": "sse-1",
        "threadId": "thread-9",
        "turnId": first_turn_id,
        "seq": 1,
        "type": "status",
        "event": "started",
        "message": "session started",
        "pending": True,
        "error": False,
    }

    relayed = events[1:-1]
    assert len(relayed) == 3  # the fake streams its answer in three delta chunks
    for note in relayed:
        assert note["method"] == "session.update"
        assert note["params"]["type"] == "delta"
        assert note["params"]["turnId"].startswith("turn-fake-")  # upstream fields kept
    assert [n["params"]["seq"] for n in relayed] == [1, 2, 3]
    assert "".join(n["params"]["delta"] for n in relayed) == "echo: hello world"

    final = events[-1]
    assert set(final) == {"jsonrpc", "id", "result"}
    assert final["id"] == "t1"
    assert final["result"]["success"] is True
    assert final["result"]["output"] == "echo: hello world"
    assert final["result"]["turnId"] == relayed[0]["params"]["turnId"]  # upstream's id wins

    # seq continues across session.message; relayed notifications took no bridge seq.
    params = session_params("sse-1", "again", threadId="thread-9")
    _, _, raw = await post_sse(http, bridge.rpc_url, request("session.message", params, "t2"))
    events = split_events(raw)
    started = events[0]["params"]
    assert started["event"] == "started"
    assert started["seq"] == 2
    assert started["threadId"] == "thread-9"
    assert started["turnId"] != first_turn_id
    assert events[-1]["id"] == "t2"
    assert events[-1]["result"]["output"] == "echo: again"

    # session.start resets the counter
    params = session_params("sse-1", "fresh", threadId="thread-9")
    _, _, raw = await post_sse(http, bridge.rpc_url, request("session.start", params, "t3"))
    assert split_events(raw)[0]["params"]["seq"] == 1


async def test_thread_id_defaults_to_session_id(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    _, _, raw = await post_sse(
        http, bridge.rpc_url, request("session.start", session_params("s-nothread"))
    )
    started = split_events(raw)[0]["params"]
    assert started["sessionId"] == started["threadId"] == "s-nothread"


async def test_id_less_turn_streams_notifications_then_done(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    _, _, raw = await post_sse(
        http, bridge.rpc_url, request("session.start", session_params("s-n", "abc"), rid=None)
    )
    events = split_events(raw)
    assert events[-1] == "[DONE]"
    assert events.count("[DONE]") == 1
    assert all(isinstance(e, dict) and "id" not in e for e in events[:-1])
    assert events[0]["params"]["event"] == "started"
    assert "".join(e["params"].get("delta", "") for e in events[1:-1]) == "echo: abc"
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_sse_carries_cors_headers_for_allowed_origin(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    headers = {**SSE_HEADERS, "Origin": "http://localhost:5173"}
    status, resp_headers, raw = await post_sse(
        http, bridge.rpc_url, request("acp.capabilities"), headers
    )
    assert status == 200
    assert resp_headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert resp_headers.getall("Vary") == [
        "Origin",
        "Access-Control-Request-Method",
        "Access-Control-Request-Headers",
    ]
    assert split_events(raw)[0]["id"] == 1


async def test_plain_mode_drops_notifications(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    body = orjson.dumps(request("session.start", session_params("p1", "quiet"), "q1"))
    async with http.post(bridge.rpc_url, data=body, headers=AUTH) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        raw = await resp.read()
    reply = orjson.loads(raw)
    assert set(reply) == {"jsonrpc", "id", "result"}
    assert reply["result"]["output"] == "echo: quiet"
    assert b"session.update" not in raw


async def test_frames_that_arrive_together_leave_together(
    start_bridge: StartBridge, serve_app: Any, http: aiohttp.ClientSession
) -> None:
    # five upstream notifications in one read are relayed in one HTTP chunk (one write),
    # in order and intact; the bridge's own "started" update goes out before them
    from aiohttp import web

    from tests.conftest import scripted_app

    def reply(body: dict[str, Any]) -> web.Response:
        notes = [
            {
                "jsonrpc": "2.0",
                "method": "session.update",
                "params": {"type": "delta", "delta": f"d{i}"},
            }
            for i in range(5)
        ]
        result = {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True, "output": "ok"}}
        raw = b"".join(b"data: " + orjson.dumps(m) + b"\n\n" for m in [*notes, result])
        return web.Response(body=raw, content_type="text/event-stream")

    base = await serve_app(scripted_app(reply, []))
    bridge = await start_bridge(env=provider_env(base))
    body = request("session.message", session_params("burst", "hello"))
    chunks: list[bytes] = []
    async with http.post(bridge.rpc_url, data=orjson.dumps(body), headers=SSE_HEADERS) as resp:
        pending = b""
        async for data, end_of_chunk in resp.content.iter_chunks():
            pending += data
            if end_of_chunk:
                chunks.append(pending)
                pending = b""
    events = [split_events(c) for c in chunks]
    deltas = [
        [e["params"]["delta"] for e in group if e.get("params", {}).get("type") == "delta"]
        for group in events
    ]
    assert ["d0", "d1", "d2", "d3", "d4"] in deltas, deltas  # all five in one chunk
    assert events[0][0]["params"]["event"] == "started"
    assert events[-1][-1]["result"]["success"] is True
