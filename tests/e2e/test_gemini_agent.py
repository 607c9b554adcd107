"""e2e: the real ``gemini --acp`` behind ``serve`` and ``gemini-adapter``, pointed at
the fake LLM's Gemini API (internal/peers/fake_gemini.py)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from internal.peers.fake_llm import STATE_KEY, create_app
from tests.conftest import TOKEN, ServeApp, StartBridge, base_env, rpc
from tests.e2e.agent_peers import isolated_env, require_agent
from tests.e2e.test_opencode_agent import cancel_after_llm_call
from tests.integration.agent_helpers import (
    agent_params,
    deltas,
    sse_stream,
    start_adapter,
    typed,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e, pytest.mark.timeout(180)]


def gemini_env(tmp: Path, llm_url: str) -> list[str]:
    return [
        *isolated_env(tmp / "home"),
        f"GOOGLE_GEMINI_BASE_URL={llm_url}",
        "GEMINI_API_KEY=x",
        "GEMINI_CLI_NO_RELAUNCH=true",
    ]


def write_file_tool(path: Path) -> list[Any]:
    call = {"name": "write_file", "arguments": {"file_path": str(path), "content": "hi gemini"}}
    return [{"content": "", "tool_calls": [call]}, "done writing"]


async def approve(http: aiohttp.ClientSession, url: str, sid: str, params: dict[str, Any]) -> None:
    once = next(o["optionId"] for o in params["options"] if o["kind"] == "allow_once")
    answer = await rpc(
        http,
        url,
        "session.permission",
        {"sessionId": sid, "requestId": params["requestId"], "optionId": once},
    )
    assert answer["result"]["accepted"] is True


async def run_flow(http: aiohttp.ClientSession, url: str, llm: Any, work: Path, sid: str) -> None:
    """Stream a prompt, approve a write, cancel a slow turn, then prompt again."""
    wd = str(work)
    events = [
        e
        async for e in sse_stream(
            http,
            url,
            "session.start",
            agent_params(sid, "hello gemini", "gemini", workingDirectory=wd),
        )
    ]
    result = events[-1]["result"]
    assert result["success"] is True, result
    assert result["stopReason"] == "end_turn"
    assert deltas(events) == "FAKE-LLM says: hello gemini"
    assert len(typed(events, "delta")) >= 2

    target = work / "gemini.txt"
    llm.script.extend(write_file_tool(target))
    events = []
    async for event in sse_stream(
        http, url, "session.message", agent_params(sid, "write it", "gemini", workingDirectory=wd)
    ):
        events.append(event)
        p = event.get("params", {})
        if p.get("type") == "permission" and p.get("pending"):
            await approve(http, url, sid, p)
    result = events[-1]["result"]
    assert target.read_text() == "hi gemini", result
    assert result["permissions"][0]["outcome"] == "allow_once"

    canceller = asyncio.create_task(cancel_after_llm_call(http, url, llm, sid))
    slow = await rpc(
        http,
        url,
        "session.message",
        agent_params(sid, "slow:20000 wait", "gemini", workingDirectory=wd),
    )
    assert (await canceller)["result"]["cancelled"] is True
    assert slow["result"]["cancelled"] is True
    after = await rpc(
        http, url, "session.message", agent_params(sid, "again", "gemini", workingDirectory=wd)
    )
    assert after["result"]["output"] == "FAKE-LLM says: again", after


async def test_gemini_behind_serve(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    binary = require_agent("gemini")
    app = create_app()
    llm_url = await serve_app(app)
    work = tmp_path / "work"
    work.mkdir()
    provider = {
        "id": "gemini",
        "label": "Gemini (local)",
        "kind": "stdio",
        "command": [binary, "--acp"],
        "env": gemini_env(tmp_path, llm_url),
        "cwd": str(work),
        "fs_read": False,
    }
    rules = [{"action": "reject", "kind": "edit", "path": "*.secret"}]
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 60, "session_timeout": 60, "permission_rules": rules},
    }
    bp = await start_bridge(config=config, tmp=tmp_path)
    await run_flow(http, bp.rpc_url, app[STATE_KEY], work, "g1")

    # a policy rule rejects the write without asking
    target = work / "no.secret"
    app[STATE_KEY].script.extend(write_file_tool(target))
    result = await rpc(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("g1", "write", "gemini", workingDirectory=str(work)),
    )
    assert not target.exists()
    assert result["result"]["permissions"][0]["decision"] == "reject"


async def test_gemini_adapter_over_http_and_sse(
    tmp_path: Path, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    binary = require_agent("gemini")
    app = create_app()
    llm_url = await serve_app(app)
    work = tmp_path / "work"
    work.mkdir()
    env = base_env(
        GEMINI_ADAPTER_AUTH_TOKEN=TOKEN,
        GEMINI_ADAPTER_BIN=binary,  # default args: --acp
        **dict(item.split("=", 1) for item in gemini_env(tmp_path, llm_url)),
    )
    config = {"allowed_roots": [str(tmp_path)], "agents": {"initialize_timeout": 60}}
    bp = await start_adapter(["gemini-adapter"], env, config, tmp_path)
    try:
        caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
        assert caps["providers"] == ["gemini"]
        assert caps["upstream"]["agentInfo"]["name"] == "gemini-cli"
        init = (await rpc(http, bp.rpc_url, "gemini.initialize", {}))["result"]
        assert init["success"] is True and init["result"]["protocolVersion"] == 1
        await run_flow(http, bp.rpc_url, app[STATE_KEY], work, "ga1")
    finally:
        await bp.stop(signal.SIGTERM, wait_s=20)
