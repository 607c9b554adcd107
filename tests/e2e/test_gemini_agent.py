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
from tests.conftest import EXPLICIT, TOKEN, ServeApp, StartBridge, base_env, rpc
from tests.e2e.agent_peers import (
    environ_of,
    isolated_env,
    request_tool_names,
    require_agent,
)
from tests.e2e.test_opencode_agent import cancel_after_llm_call
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


BRIDGE_SECRETS = {
    "ACP_AUTH_TOKEN": TOKEN,
    "LLM_API_KEY": "llm-e2e-secret-0003",
    "INTERNAL_SERVICE_TOKEN": "svc-e2e-secret-0004",
}


def gemini_provider(tmp: Path, llm_url: str, work: Path, **extra: Any) -> dict[str, Any]:
    return {
        "id": "gemini",
        "label": "Gemini (local)",
        "kind": "stdio",
        "command": [require_agent("gemini"), "--acp"],
        "env": gemini_env(tmp, llm_url),
        "cwd": str(work),
        "fs_read": False,
        **extra,
    }


def gemini_config(tmp: Path, provider: dict[str, Any], **agents: Any) -> dict[str, Any]:
    return {
        "providers": [provider],
        "allowed_roots": [str(tmp)],
        "agents": {
            "initialize_timeout": 60,
            "session_timeout": 60,
            "prompt_timeout": 120,
            **agents,
        },
    }


def turn_params(sid: str, prompt: str, work: Path, **routing: Any) -> dict[str, Any]:
    return {
        "sessionId": sid,
        "taskPrompt": prompt,
        "workingDirectory": str(work),
        "routing": {**EXPLICIT, "explicitProviderId": "gemini", **routing},
    }


async def test_model_toolbridge_usage_and_a_clean_environment(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    marker = f"XWM_E2E_MARKER={tmp_path.name}"
    provider = gemini_provider(tmp_path, llm_url, work, toolbridge=True)
    provider["env"].append(marker)
    bp = await start_bridge(
        config=gemini_config(tmp_path, provider), env=base_env(**BRIDGE_SECRETS), tmp=tmp_path
    )
    before = len(llm.requests)
    params = turn_params("gm", "hello model", work, explicitModel="gemini-2.5-pro")
    result = (await rpc(http, bp.rpc_url, "session.start", params))["result"]
    assert result["success"] is True, result
    assert result["output"] == "FAKE-LLM says: hello model"
    assert result["agentModel"] == "gemini-2.5-pro" and result["agentMode"] == "default"
    # the turn's call: the chosen model in the path, the toolbridge's tools offered
    calls = [r for r in llm.requests[before:] if r["path"].endswith(":streamGenerateContent")]
    assert calls and {r["path"] for r in calls} == {
        "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    }, [r["path"] for r in llm.requests[before:]]
    names = request_tool_names(calls[-1]["body"])
    # gemini names MCP tools mcp_<server>_<tool>
    wanted = {f"mcp_xwm-toolbridge_{t}" for t in ("chat", "claude_review", "vault_kv")}
    assert wanted <= names, names
    usage = result["usage"]
    assert usage["inputTokens"] > 0 and usage["outputTokens"] > 0, usage
    assert result["sessionUsage"]["turns"] == 1

    pids = processes_with(marker)
    assert pids
    for pid in pids:
        environ = environ_of(pid)
        assert not {k for k, v in environ.items() if v in BRIDGE_SECRETS.values()}, pid
        assert not set(BRIDGE_SECRETS) & set(environ)


async def test_authenticate_with_an_api_key(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """gemini set to the API-key method but given no key fails ``session/new`` with
    -32000; the bridge authenticates with the configured key and retries."""
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    env = [e for e in gemini_env(tmp_path, llm_url) if not e.startswith("GEMINI_API_KEY=")]
    settings = tmp_path / "home" / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    key = "gemini-e2e-key-0005"
    no_key = gemini_provider(tmp_path, llm_url, work, env=env)
    bp = await start_bridge(config=gemini_config(tmp_path, no_key), tmp=tmp_path)
    failed = (await rpc(http, bp.rpc_url, "session.start", turn_params("a0", "hi", work)))["result"]
    assert failed["success"] is False
    assert failed["error"].startswith("agent gemini requires authentication"), failed
    assert "gemini-api-key (Gemini API key)" in failed["error"]
    await bp.stop()

    keyed = gemini_provider(
        tmp_path, llm_url, work, env=env, auth_method="gemini-api-key", auth_api_key=key
    )
    bp = await start_bridge(config=gemini_config(tmp_path, keyed), tmp=tmp_path)
    before = len(llm.requests)
    ok = (await rpc(http, bp.rpc_url, "session.start", turn_params("a1", "hi there", work)))[
        "result"
    ]
    assert ok["success"] is True, ok
    assert ok["output"] == "FAKE-LLM says: hi there"
    sent = {r["headers"].get("x-goog-api-key") for r in llm.requests[before:]}
    assert key in sent, sent
    assert key not in "\n".join(bp.logs)


@needs_bwrap
async def test_bwrap_keeps_gemini_writes_in_the_working_directory(
    tmp_path: Path, serve_app: ServeApp, start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    outside = tmp_path / "outside"
    outside.mkdir()
    results = {}
    for sandbox in ("none", "bwrap"):
        work = tmp_path / f"work-{sandbox}"
        work.mkdir()
        provider = gemini_provider(tmp_path, llm_url, work)
        config = gemini_config(
            tmp_path, provider, sandbox=sandbox, permission_rules=[{"action": "allow", "kind": "*"}]
        )
        bp = await start_bridge(config=config, tmp=tmp_path)
        target, inside = outside / f"{sandbox}.txt", work / "inside.txt"
        command = f"echo out > {target}; echo in > {inside}"
        call = {"name": "run_shell_command", "arguments": {"command": command}}
        llm.script.extend([{"content": "", "tool_calls": [call]}, "done"])
        done = await rpc(http, bp.rpc_url, "session.start", turn_params("w", "go", work))
        assert done["result"]["success"] is True, done
        results[sandbox] = (target.exists(), inside.exists())
        await bp.stop()
    assert results["none"] == (True, True)  # the same command writes both without bwrap
    assert results["bwrap"] == (False, True)
