"""``xwm-bridge agent-adapter`` / ``gemini-adapter`` against the scripted ACP agent."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import AUTH, ROOT, TOKEN, BridgeProcess, base_env, rpc
from tests.integration.agent_helpers import (
    FAKE_AGENT,
    deltas,
    sse_stream,
    start_adapter,
    typed,
)

pytestmark = pytest.mark.asyncio


def adapter_env(**extra: str) -> dict[str, str]:
    settings = {
        "GEMINI_ADAPTER_AUTH_TOKEN": TOKEN,
        "GEMINI_ADAPTER_BIN": FAKE_AGENT[0],
        "GEMINI_ADAPTER_ARGS": " ".join(FAKE_AGENT[1:]),
        "GEMINI_ADAPTER_PROVIDER_ID": "fakeagent",
        "GEMINI_ADAPTER_PROVIDER_LABEL": "Fake Agent",
    }
    return base_env(**{**settings, **extra})


@pytest.fixture
async def adapter(tmp_path: Path) -> AsyncIterator[BridgeProcess]:
    config = {"allowed_roots": [str(tmp_path)], "agents": {"initialize_timeout": 20}}
    bp = await start_adapter(["gemini-adapter"], adapter_env(), config, tmp_path)
    yield bp
    await bp.stop(signal.SIGTERM, wait_s=15)


async def test_capabilities_and_gemini_methods(
    adapter: BridgeProcess, http: aiohttp.ClientSession
) -> None:
    caps = (await rpc(http, adapter.rpc_url, "acp.capabilities", {}))["result"]
    assert caps["singleAgent"] is True and caps["providers"] == ["fakeagent"]
    assert caps["provider"] == {"id": "fakeagent", "label": "Fake Agent"}
    assert caps["upstream"]["protocolVersion"] == 1
    assert caps["upstream"]["agentCapabilities"]["loadSession"] is False
    init = (await rpc(http, adapter.rpc_url, "gemini.initialize", {}))["result"]
    assert init["success"] is True and init["result"]["protocolVersion"] == 1
    raw = (
        await rpc(
            http,
            adapter.rpc_url,
            "gemini.raw",
            {"method": "session/new", "params": {"cwd": "/", "mcpServers": []}},
        )
    )["result"]
    assert raw["success"] is True and raw["response"]["result"]["sessionId"].startswith("fake-sess")
    err = (await rpc(http, adapter.rpc_url, "gemini.raw", {"method": "bogus"}))["result"]
    assert err["response"]["error"]["code"] == -32601
    blank = (await rpc(http, adapter.rpc_url, "gemini.raw", {"method": " "}))["result"]
    assert blank == {"success": False, "error": "method is required"}
    # auth as in serve; routes other than /acp/rpc and /acp are 404
    async with http.post(
        adapter.rpc_url, data=b"{}", headers={"Authorization": "Bearer nope"}
    ) as r:
        assert r.status == 401
    async with http.get(f"{adapter.url}/api/ping", headers=AUTH) as r:
        assert r.status == 404


async def test_session_flow_over_sse_with_permission_and_cancel(
    adapter: BridgeProcess, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    wd = str(tmp_path)
    params: dict[str, Any] = {"sessionId": "a1", "taskPrompt": "hello", "workingDirectory": wd}
    events = [e async for e in sse_stream(http, adapter.rpc_url, "session.start", params)]
    result = events[-1]["result"]
    assert deltas(events) == "agent says: hello"
    assert result["success"] is True and result["provider"] == "fakeagent"
    assert result["stopReason"] == "end_turn"

    target = tmp_path / "f.txt"
    events = []
    async for event in sse_stream(
        http, adapter.rpc_url, "session.message", {**params, "taskPrompt": f"permission {target}"}
    ):
        events.append(event)
        p = event.get("params", {})
        if p.get("type") == "permission" and p.get("pending"):
            await rpc(
                http,
                adapter.rpc_url,
                "session.permission",
                {"sessionId": "a1", "requestId": p["requestId"], "optionId": "once"},
            )
    assert target.exists()
    assert typed(events, "tool_call")[0]["kind"] == "edit"

    events = []
    async for event in sse_stream(
        http, adapter.rpc_url, "session.message", {**params, "taskPrompt": "slow"}
    ):
        events.append(event)
        if event.get("params", {}).get("delta") == "working":
            await rpc(http, adapter.rpc_url, "session.cancel", {"sessionId": "a1"})
    assert events[-1]["result"]["cancelled"] is True
    after = await rpc(http, adapter.rpc_url, "session.message", {**params, "taskPrompt": "ok"})
    assert after["result"]["output"] == "agent says: ok"


async def test_start_failure_is_reported(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    env = adapter_env(GEMINI_ADAPTER_BIN="/nonexistent/gemini")
    bp = await start_adapter(["agent-adapter"], env, None, tmp_path)
    try:
        caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
        assert caps["success"] is False and "cannot start agent" in caps["error"]
        turn = await rpc(http, bp.rpc_url, "session.start", {"sessionId": "x", "taskPrompt": "hi"})
        assert turn["result"]["success"] is False
    finally:
        await bp.stop(signal.SIGTERM, wait_s=15)


async def test_the_yaml_provider_is_used_and_a_missing_binary_is_named(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Issue 15 item 10: with no GEMINI_ADAPTER_BIN/ARGS/LABEL, the YAML provider's
    command, label, env and cwd are used; a binary that does not exist is named."""
    env = base_env(GEMINI_ADAPTER_AUTH_TOKEN=TOKEN)
    provider = {
        "id": "gemini",
        "kind": "stdio",
        "label": "Gemini from YAML",
        "command": FAKE_AGENT,
        "env": ["FAKE_AGENT_NAME=from-yaml"],
        "cwd": str(ROOT),
    }
    config = {"providers": [provider], "agents": {"initialize_timeout": 20}}
    bp = await start_adapter(["gemini-adapter"], env, config, tmp_path)
    try:
        caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
        assert caps["singleAgent"] is True, caps
        assert caps["provider"] == {"id": "gemini", "label": "Gemini from YAML"}
    finally:
        await bp.stop(signal.SIGTERM, wait_s=15)
    missing = {**provider, "command": ["no-such-agent-binary-xyz", "--acp"]}
    bp = await start_adapter(["gemini-adapter"], env, {"providers": [missing]}, tmp_path)
    try:
        caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
        assert caps["success"] is False
        assert "no-such-agent-binary-xyz" in caps["error"], caps["error"]
    finally:
        await bp.stop(signal.SIGTERM, wait_s=15)
