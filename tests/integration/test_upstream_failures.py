"""Upstream failures become clean ``success:false`` results, quickly, never hangs
(forwarding.md §4.3-§4.5, §4.10; examples.md §4 failure variant; ARCHITECTURE.md §2)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    ServeApp,
    StartBridge,
    base_env,
    closed_port,
    provider_env,
    rpc,
    scripted_app,
    session_params,
    sse,
    updates,
)

ROUTING_FIELDS_CODEX = {
    "resolvedExecutionTarget": "single-agent",
    "resolvedProviderId": "codex",
    "resolvedGatewayProviderId": "",
    "resolvedModel": "",
    "resolvedSkills": None,
    "skillResolutionSource": "none",
    "needsSkillInstall": False,
    "unavailable": False,
}


async def failed_turn(
    http: aiohttp.ClientSession, url: str, session_id: str, prompt: str, limit: float = 5
) -> str:
    """Run one SSE turn expected to fail; check the §4.10 shape; return the error text."""
    began = time.monotonic()
    events = await asyncio.wait_for(
        sse(http, url, "session.start", session_params(session_id, prompt)), limit
    )
    assert time.monotonic() - began < limit
    started, failed = updates(events)
    assert started["event"] == "started" and started["seq"] == 1
    message = failed["message"]
    assert isinstance(message, str) and message
    assert failed == {
        "sessionId": session_id,
        "threadId": session_id,
        "turnId": started["turnId"],
        "seq": 2,
        "type": "status",
        "event": "completed",
        "message": message,
        "pending": False,
        "error": True,
    }
    assert events[-1]["result"] == {
        "success": False,
        "error": message,
        "turnId": started["turnId"],
        "mode": "single-agent",
        "provider": "codex",
        **ROUTING_FIELDS_CODEX,
    }
    return message


def bridge_env(endpoint: str) -> dict[str, str]:
    return base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=endpoint)


@pytest.mark.parametrize("scheme", ["http", "ws"])
async def test_connection_refused(
    start_bridge: StartBridge, http: aiohttp.ClientSession, scheme: str
) -> None:
    port = closed_port()
    path = "/acp/rpc" if scheme == "http" else "/acp"
    bridge = await start_bridge(env=bridge_env(f"{scheme}://127.0.0.1:{port}{path}"))
    error = await failed_turn(http, bridge.rpc_url, "s-refused", "hi", limit=3)
    assert f"127.0.0.1:{port}" in error

    # the thread is not stuck and seq went on past the failure
    events = await sse(http, bridge.rpc_url, "session.message", session_params("s-refused", "x"))
    assert [u["seq"] for u in updates(events)] == [3, 4]


async def test_malformed_response(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    error = await failed_turn(http, bridge.rpc_url, "s-bad", "malformed")
    assert error.startswith("invalid upstream response")


async def test_http_error_status_with_plain_text(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    error = await failed_turn(http, bridge.rpc_url, "s-502", "status:502")
    assert "HTTP 502" in error
    assert "upstream exploded" in error


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_upstream_jsonrpc_error(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    transport: str,
) -> None:
    endpoint = fake_upstream.url if transport == "http" else fake_upstream.ws_url
    bridge = await start_bridge(env=bridge_env(endpoint))
    assert await failed_turn(http, bridge.rpc_url, "s-err", "error") == "fake upstream error"
    # the same session goes on working
    reply = await rpc(http, bridge.rpc_url, "session.message", session_params("s-err", "ok"))
    assert reply["result"]["output"] == "echo: ok"


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            lambda body: {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -1}},
            "external ACP request failed",
        ),
        (lambda body: [1, 2, 3], "invalid upstream response"),
        (
            lambda body: web.Response(
                body=b'data: {"jsonrpc":"2.0","method":"session.update","params":{"delta":"x"}}'
                b"\n\n",
                content_type="text/event-stream",
            ),
            "upstream stream ended without a response",
        ),
    ],
    ids=["error-without-message", "json-array", "sse-without-response"],
)
async def test_scripted_bad_upstream_answers(
    start_bridge: StartBridge,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    reply: Any,
    expected: str,
) -> None:
    base = await serve_app(scripted_app(reply, []))
    bridge = await start_bridge(env=bridge_env(base))
    error = await failed_turn(http, bridge.rpc_url, "s-scripted", "hi")
    assert error.startswith(expected), error


def timeout_config(endpoint: str, **timeouts: float) -> dict[str, Any]:
    return {"providers": [{"id": "codex", "endpoint": endpoint, **timeouts}]}


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_total_timeout(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    endpoint = fake_upstream.url if transport == "http" else fake_upstream.ws_url
    config = timeout_config(endpoint, total_timeout=1)
    bridge = await start_bridge(config=config, tmp=tmp_path)
    began = time.monotonic()
    error = await failed_turn(http, bridge.rpc_url, "s-total", "slow:10000", limit=4)
    assert time.monotonic() - began >= 0.9
    assert "timed out" in error
    # the upstream may still be working: the bridge tells it to stop
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s-total"]


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_read_timeout(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    transport: str,
) -> None:
    endpoint = fake_upstream.url if transport == "http" else fake_upstream.ws_url
    config = timeout_config(endpoint, read_timeout=0.5, total_timeout=30)
    bridge = await start_bridge(config=config, tmp=tmp_path)
    began = time.monotonic()
    error = await failed_turn(http, bridge.rpc_url, "s-read", "hang", limit=4)
    assert time.monotonic() - began >= 0.4
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s-read"]
    if transport == "http":
        assert error.startswith(f"POST {fake_upstream.url}/acp/rpc: ")
        assert "timeout" in error.lower()
    else:
        assert error == f"{fake_upstream.ws_url}: no message from upstream for 0.5s"


@pytest.mark.parametrize("transport", ["http", "ws"])
async def test_null_result_returns_promptly(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    transport: str,
) -> None:
    """The original never recognised ``"result": null`` on a WebSocket and hung 2 minutes."""
    endpoint = fake_upstream.url if transport == "http" else fake_upstream.ws_url
    bridge = await start_bridge(env=bridge_env(endpoint))
    began = time.monotonic()
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", session_params("s-null", "nullresult")), 5
    )
    assert time.monotonic() - began < 3
    [started] = updates(events)  # no completed-error: this is not a failure
    result = events[-1]["result"]
    # §4.7 step 1: without a non-empty result object the envelope itself is the result
    assert result["result"] is None
    assert result["jsonrpc"] == "2.0"
    assert str(result["id"]).startswith("req-")
    assert "error" not in result
    assert result["mode"] == "single-agent"
    assert result["provider"] == "codex"
    assert result["turnId"] == started["turnId"]
    assert result["resolvedProviderId"] == "codex"
