"""e2e: the real ``opencode acp`` behind ``serve``, pointed at the in-repo fake LLM."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from internal.peers.fake_llm import STATE_KEY, create_app
from tests.conftest import TOKEN, ServeApp, StartBridge, base_env, rpc, wait_until
from tests.e2e.agent_peers import opencode_provider
from tests.integration.agent_helpers import (
    agent_params,
    deltas,
    sse_stream,
    start_adapter,
    typed,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e, pytest.mark.timeout(180)]


async def setup(
    tmp: Path, serve_app: ServeApp, start_bridge: StartBridge, **agents: Any
) -> tuple[str, Any, Path]:
    app = create_app()
    llm_url = await serve_app(app)
    work = tmp / "work"
    work.mkdir()
    config = {
        "providers": [opencode_provider(tmp, llm_url, work)],
        "allowed_roots": [str(tmp)],
        "agents": {
            "initialize_timeout": 60,
            "session_timeout": 60,
            "prompt_timeout": 120,
            **agents,
        },
    }
    bp = await start_bridge(config=config, tmp=tmp)
    return bp.rpc_url, app[STATE_KEY], work


async def cancel_after_llm_call(
    http: aiohttp.ClientSession, url: str, llm: Any, session_id: str
) -> dict[str, Any]:
    """Send session.cancel once the agent is waiting on the (slow) fake LLM."""
    before = len(llm.requests)
    await wait_until(lambda: len(llm.requests) > before, within=60)
    await asyncio.sleep(0.3)
    return await rpc(http, url, "session.cancel", {"sessionId": session_id})


def write_tool(path: Path) -> dict[str, Any]:
    return {
        "replies": [
            {
                "content": "",
                "tool_calls": [
                    {
                        "name": "write",
                        "arguments": {"filePath": str(path), "content": "hi from tool"},
                    }
                ],
            },
            "done writing",
        ]
    }


async def test_prompt_streams_permission_approved_and_cancel(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    url, llm, work = await setup(tmp_path, serve_app, start_bridge)
    wd = str(work)
    caps = await rpc(http, url, "acp.capabilities", {})
    assert caps["result"]["providerCatalog"] == [
        {"providerId": "opencode", "label": "OpenCode (local)"}
    ]

    # 1. a prompt streams chunks and returns the fake's reply
    events = [
        e
        async for e in sse_stream(
            http,
            url,
            "session.start",
            agent_params("e1", "hello there", "opencode", workingDirectory=wd),
        )
    ]
    result = events[-1]["result"]
    assert result["success"] is True, result
    assert result["stopReason"] == "end_turn"
    assert result["output"] == "FAKE-LLM says: hello there"
    assert deltas(events) == "FAKE-LLM says: hello there"
    assert len(typed(events, "delta")) >= 2

    # 2. a tool call that asks permission, approved by the client
    target = work / "approved.txt"
    llm.script.extend(write_tool(target)["replies"])
    events = []
    async for event in sse_stream(
        http,
        url,
        "session.message",
        agent_params("e1", "write it", "opencode", workingDirectory=wd),
    ):
        events.append(event)
        params = event.get("params", {})
        if params.get("type") == "permission" and params.get("pending"):
            once = next(o["optionId"] for o in params["options"] if o["kind"] == "allow_once")
            answer = await rpc(
                http,
                url,
                "session.permission",
                {"sessionId": "e1", "requestId": params["requestId"], "optionId": once},
            )
            assert answer["result"]["accepted"] is True
    result = events[-1]["result"]
    assert result["success"] is True, result
    assert target.read_text() == "hi from tool"
    assert result["permissions"][0]["outcome"] == "allow_once"
    assert result["output"].endswith("done writing")
    assert any(u.get("status") == "completed" for u in typed(events, "tool_call_update"))

    # 3. cancel mid-turn returns cancelled, and the next turn works
    canceller = asyncio.create_task(cancel_after_llm_call(http, url, llm, "e1"))
    slow = await rpc(
        http,
        url,
        "session.message",
        agent_params("e1", "slow:20000 take your time", "opencode", workingDirectory=wd),
    )
    assert (await canceller)["result"]["cancelled"] is True
    assert slow["result"]["success"] is False and slow["result"]["cancelled"] is True
    after = await rpc(
        http, url, "session.message", agent_params("e1", "and now", "opencode", workingDirectory=wd)
    )
    assert after["result"]["output"] == "FAKE-LLM says: and now", after


async def test_policy_rule_rejects_the_tool_call(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    rules = [{"action": "reject", "kind": "edit", "path": "*.txt"}]
    url, llm, work = await setup(tmp_path, serve_app, start_bridge, permission_rules=rules)
    target = work / "rejected.txt"
    # the first prompt of a session also makes opencode ask its small model for a title:
    # warm up so the scripted tool call goes to the turn itself
    warm = await rpc(
        http, url, "session.start", agent_params("e2", "hi", "opencode", workingDirectory=str(work))
    )
    assert warm["result"]["success"] is True, warm
    llm.script.extend(write_tool(target)["replies"])
    events = [
        e
        async for e in sse_stream(
            http,
            url,
            "session.message",
            agent_params("e2", "write it", "opencode", workingDirectory=str(work)),
        )
    ]
    result = events[-1]["result"]
    assert not target.exists()
    record = result["permissions"][0]
    assert record["decision"] == "reject" and record["outcome"] == "reject_once"
    assert [p for p in typed(events, "permission") if p["decision"] == "reject"]


async def test_agent_adapter_serves_opencode_over_http_and_sse(
    tmp_path: Path, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    provider = opencode_provider(tmp_path, llm_url, work)
    # the YAML entry with the adapter's provider id supplies env and cwd; the command
    # comes from GEMINI_ADAPTER_BIN / GEMINI_ADAPTER_ARGS
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 60, "session_timeout": 60},
    }
    env = base_env(
        GEMINI_ADAPTER_AUTH_TOKEN=TOKEN,
        GEMINI_ADAPTER_BIN=provider["command"][0],
        GEMINI_ADAPTER_ARGS="acp",
        GEMINI_ADAPTER_PROVIDER_ID="opencode",
        GEMINI_ADAPTER_PROVIDER_LABEL="OpenCode",
    )
    bp = await start_adapter(["agent-adapter"], env, config, tmp_path)
    try:
        caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
        assert caps["upstream"]["agentInfo"]["name"] == "OpenCode"
        assert caps["upstream"]["agentCapabilities"]["loadSession"] is True
        params = {"sessionId": "ad1", "taskPrompt": "hello adapter", "workingDirectory": str(work)}
        events = [e async for e in sse_stream(http, bp.rpc_url, "session.start", params)]
        assert deltas(events) == "FAKE-LLM says: hello adapter"
        assert events[-1]["result"]["stopReason"] == "end_turn"

        target = work / "adapter.txt"
        llm.script.extend(write_tool(target)["replies"])
        events = []
        async for event in sse_stream(
            http, bp.rpc_url, "session.message", {**params, "taskPrompt": "write"}
        ):
            events.append(event)
            p = event.get("params", {})
            if p.get("type") == "permission" and p.get("pending"):
                once = next(o["optionId"] for o in p["options"] if o["kind"] == "allow_once")
                await rpc(
                    http,
                    bp.rpc_url,
                    "session.permission",
                    {"sessionId": "ad1", "requestId": p["requestId"], "optionId": once},
                )
        assert target.read_text() == "hi from tool"
        assert events[-1]["result"]["permissions"][0]["outcome"] == "allow_once"

        canceller = asyncio.create_task(cancel_after_llm_call(http, bp.rpc_url, llm, "ad1"))
        slow = await rpc(
            http, bp.rpc_url, "session.message", {**params, "taskPrompt": "slow:20000 wait"}
        )
        assert (await canceller)["result"]["cancelled"] is True
        assert slow["result"]["cancelled"] is True
        after = await rpc(http, bp.rpc_url, "session.message", {**params, "taskPrompt": "again"})
        assert after["result"]["output"] == "FAKE-LLM says: again"
    finally:
        await bp.stop(signal.SIGTERM, wait_s=20)
