"""e2e: the real ``opencode acp`` behind ``serve``, pointed at the in-repo fake LLM."""

from __future__ import annotations

import asyncio
import base64
import signal
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from internal.peers.fake_gemini import gemini_user_text
from internal.peers.fake_llm import STATE_KEY, create_app, user_text
from tests.conftest import EXPLICIT, TOKEN, ServeApp, StartBridge, base_env, rpc, wait_until
from tests.e2e.agent_peers import (
    environ_of,
    opencode_provider,
    request_tool_names,
)
from tests.integration.agent_helpers import (
    agent_params,
    deltas,
    sse_stream,
    start_adapter,
    typed,
)
from tests.markers import needs_bwrap
from tests.processes import processes_with

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
    await wait_until(lambda: slow_call_since(llm, before), within=60)
    return await rpc(http, url, "session.cancel", {"sessionId": session_id})


def slow_call_since(llm: Any, before: int) -> bool:
    """Since request ``before``, the agent's model call for a ``slow:`` prompt reached the
    fake LLM, which holds it (OpenAI-style, or Gemini-style as internal/peers/fake_gemini.py
    serves it: its JSON-mode side calls are answered at once, so they do not count)."""
    return any(_held(r["body"]) for r in llm.requests[before:])


def _held(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    if "messages" in body:
        return user_text(body["messages"]).startswith("slow:")
    config = body.get("generationConfig") or {}
    if config.get("responseMimeType") == "application/json":
        return False
    return gemini_user_text(body.get("contents")).startswith("slow:")


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


BRIDGE_SECRETS = {
    "ACP_AUTH_TOKEN": TOKEN,
    "LLM_API_KEY": "llm-e2e-secret-0001",
    "INTERNAL_SERVICE_TOKEN": "svc-e2e-secret-0002",
}


def turn_params(sid: str, prompt: str, work: Path, **routing: Any) -> dict[str, Any]:
    return {
        "sessionId": sid,
        "taskPrompt": prompt,
        "workingDirectory": str(work),
        "routing": {**EXPLICIT, "explicitProviderId": "opencode", **routing},
    }


async def test_model_toolbridge_usage_and_a_clean_environment(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    provider = opencode_provider(tmp_path, llm_url, work)
    marker = f"XWM_E2E_MARKER={tmp_path.name}"
    provider["env"].append(marker)
    provider["toolbridge"] = True
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 60, "session_timeout": 60, "prompt_timeout": 120},
    }
    bp = await start_bridge(config=config, env=base_env(**BRIDGE_SECRETS), tmp=tmp_path)

    before = len(llm.requests)
    params = turn_params("m1", "hello model", work, explicitModel="other-model")
    result = (await rpc(http, bp.rpc_url, "session.start", params))["result"]
    assert result["success"] is True, result
    assert result["output"] == "FAKE-LLM says: hello model"
    assert result["agentModel"] == "fake/other-model" and result["agentMode"] == "build"
    assert result["mcpServers"] == ["xwm-toolbridge"]
    # the turn's own call (the one offering tools; the title call offers none)
    calls = [
        r["body"]
        for r in llm.requests[before:]
        if r["path"].endswith("/chat/completions") and r["body"].get("tools")
    ]
    assert calls, [r["body"].get("model") for r in llm.requests[before:]]
    assert {c["model"] for c in calls} == {"other-model"}
    names = request_tool_names(calls[-1])
    # opencode names MCP tools <server>_<tool>
    assert {"xwm-toolbridge_chat", "xwm-toolbridge_claude_review", "xwm-toolbridge_vault_kv"} <= (
        names
    ), names
    # usage is reported per turn and summed per session
    usage = result["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0, usage
    assert result["sessionUsage"]["turns"] == 1

    # none of the bridge's secrets is in the agent's (or its children's) environment
    pids = processes_with(marker)
    assert pids
    for pid in pids:
        environ = environ_of(pid)
        leaked = {k for k, v in environ.items() if v in BRIDGE_SECRETS.values()}
        assert not leaked, (pid, leaked)
        assert not set(BRIDGE_SECRETS) & set(environ)
    assert any(environ_of(pid).get("PATH") for pid in pids)


async def test_image_attachment_reaches_the_model(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    png = base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    )
    (work / "dot.png").write_bytes(png)
    provider = {**opencode_provider(tmp_path, llm_url, work), "model": "other-model"}
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 60, "session_timeout": 60, "prompt_timeout": 120},
    }
    bp = await start_bridge(config=config, tmp=tmp_path)
    before = len(llm.requests)
    params = {
        **turn_params("img", "describe it", work),
        "attachments": [{"name": "dot.png", "path": str(work / "dot.png")}],
    }
    result = (await rpc(http, bp.rpc_url, "session.start", params))["result"]
    assert result["success"] is True, result
    assert result["attachments"][0]["sentAs"] == "image"
    bodies = [orjson.dumps(r["body"]).decode() for r in llm.requests[before:]]
    encoded = base64.b64encode(png).decode()
    assert any(encoded in b for b in bodies), "the image never reached the model"


def bash_tool(command: str) -> list[Any]:
    call = {"name": "bash", "arguments": {"command": command, "description": "write a file"}}
    return [{"content": "", "tool_calls": [call]}, "done"]


@needs_bwrap
async def test_bwrap_keeps_opencode_writes_in_the_working_directory(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    outside = tmp_path / "outside"
    outside.mkdir()
    allow = [{"action": "allow", "kind": "*"}]
    results = {}
    for sandbox in ("none", "bwrap"):
        work = tmp_path / f"work-{sandbox}"
        work.mkdir()
        config = {
            "providers": [opencode_provider(tmp_path, llm_url, work)],
            "allowed_roots": [str(tmp_path)],
            "agents": {
                "initialize_timeout": 60,
                "session_timeout": 60,
                "prompt_timeout": 120,
                "permission_rules": allow,
                "sandbox": sandbox,
            },
        }
        bp = await start_bridge(config=config, tmp=tmp_path)
        warm = await rpc(http, bp.rpc_url, "session.start", turn_params("w", "hi", work))
        assert warm["result"]["success"] is True, warm
        target, inside = outside / f"{sandbox}.txt", work / "inside.txt"
        llm.script.extend(bash_tool(f"echo out > {target}; echo in > {inside}"))
        done = await rpc(http, bp.rpc_url, "session.message", turn_params("w", "go", work))
        assert done["result"]["success"] is True, done
        results[sandbox] = (target.exists(), inside.exists())
        await bp.stop()
    assert results["none"] == (True, True)  # the same command writes both without bwrap
    assert results["bwrap"] == (False, True)
