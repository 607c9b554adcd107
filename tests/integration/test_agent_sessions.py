"""Stdio agent sessions against the scripted agent: authentication, models, modes and
options, MCP servers, image and resource blocks, usage (result, replay, store,
/metrics)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import AUTH, TOKEN, StartBridge, base_env, rpc
from tests.integration.agent_helpers import agent_params, agent_provider, sse_stream, typed

pytestmark = pytest.mark.asyncio

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


def cfg(tmp: Path, *providers: dict[str, Any], **agents: Any) -> dict[str, Any]:
    return {
        "providers": list(providers) or [agent_provider()],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20, **agents},
    }


async def turn(
    http: aiohttp.ClientSession,
    url: str,
    sid: str,
    prompt: str,
    method: str = "session.message",
    provider: str = "fake",
    **extra: Any,
) -> dict[str, Any]:
    answer = await rpc(http, url, method, agent_params(sid, prompt, provider, **extra))
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


# --- authentication ------------------------------------------------------------------


async def test_auth_required_then_authenticate_with_the_configured_method(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    env = ["FAKE_AGENT_AUTH=fake-key", "FAKE_AGENT_API_KEY=key-0123456789"]
    good = agent_provider("good", env=env, auth_method="fake-key", auth_api_key="key-0123456789")
    bad = agent_provider("bad", env=env, auth_method="fake-key", auth_api_key="wrong-key-42")
    none = agent_provider("none", env=env)
    other = agent_provider("other", env=env, auth_method="oauth")
    eager = agent_provider(
        "eager", env=env, auth_method="fake-key", auth_api_key="key-0123456789", auth_on_start=True
    )
    bp = await start_bridge(config=cfg(tmp_path, good, bad, none, other, eager), tmp=tmp_path)
    wd = str(tmp_path)
    ok = await turn(http, bp.rpc_url, "a1", "hello", provider="good", workingDirectory=wd)
    assert ok["success"] is True and ok["output"] == "agent says: hello"
    again = await turn(http, bp.rpc_url, "a1", "more", provider="good", workingDirectory=wd)
    assert again["success"] is True and again["sessionContinuity"] == "continued"

    failed = await turn(http, bp.rpc_url, "a2", "hello", provider="bad", workingDirectory=wd)
    assert failed["success"] is False
    assert failed["error"] == "agent bad: authenticate with fake-key failed: bad credentials"

    missing = await turn(http, bp.rpc_url, "a3", "hello", provider="none", workingDirectory=wd)
    assert missing["success"] is False
    assert missing["error"].startswith("agent none requires authentication")
    assert "fake-key (Fake API key)" in missing["error"]

    unknown = await turn(http, bp.rpc_url, "a4", "hello", provider="other", workingDirectory=wd)
    assert "auth_method 'oauth' is not one of its authMethods: fake-key" in unknown["error"]

    up_front = await turn(http, bp.rpc_url, "a5", "hi", provider="eager", workingDirectory=wd)
    assert up_front["success"] is True
    logs = "\n".join(bp.logs)
    assert "key-0123456789" not in logs and "wrong-key-42" not in logs
    assert '"msg":"agent authenticated"' in logs


async def test_auth_with_the_registry_method_and_a_key_from_the_environment(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A provider with a registry id (gemini) gets its key variable copied from the
    bridge's environment and is authenticated with the registry's method."""
    provider = agent_provider(
        "gemini", env=["FAKE_AGENT_AUTH=gemini-api-key", "FAKE_AGENT_API_KEY=gk-abcdef123"]
    )
    env = base_env(ACP_AUTH_TOKEN=TOKEN, GEMINI_API_KEY="gk-abcdef123")
    bp = await start_bridge(config=cfg(tmp_path, provider), env=env, tmp=tmp_path)
    result = await turn(
        http, bp.rpc_url, "g1", "hello", provider="gemini", workingDirectory=str(tmp_path)
    )
    assert result["success"] is True, result
    assert '"key":"env:GEMINI_API_KEY"' in "\n".join(bp.logs)


# --- models, modes, options ------------------------------------------------------------


@pytest.mark.parametrize("style", ["config", "legacy"])
async def test_model_mode_and_options_reach_the_agent(
    style: str, start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    extra: dict[str, Any] = {"mode": "code"}
    if style == "config":
        extra["options"] = ["thought_level=high"]
    provider = agent_provider(env=[f"FAKE_AGENT_OPTIONS={style}"], **extra)
    bp = await start_bridge(config=cfg(tmp_path, provider), tmp=tmp_path)
    wd = str(tmp_path)
    caps = await rpc(http, bp.rpc_url, "acp.capabilities", {})
    fake = next(a for a in caps["result"]["localAgents"] if a["id"] == "fake")
    assert fake["found"] is True and fake["learned"] is False  # not started yet

    first = await turn(http, bp.rpc_url, "m1", "whoami", "session.start", workingDirectory=wd)
    thought = "high" if style == "config" else "low"
    assert first["output"] == f"model=fake/alpha mode=code thought={thought}"
    assert first["agentModel"] == "fake/alpha" and first["agentMode"] == "code"

    # an explicit model, by its short name; the agent's own value is used
    routing = {
        "routingMode": "explicit",
        "explicitExecutionTarget": "singleAgent",
        "explicitProviderId": "fake",
        "explicitModel": "beta",
    }
    params = {"sessionId": "m1", "taskPrompt": "whoami", "workingDirectory": wd}
    chosen = (await rpc(http, bp.rpc_url, "session.message", {**params, "routing": routing}))[
        "result"
    ]
    assert chosen["output"].startswith("model=fake/beta mode=code")
    assert chosen["agentModel"] == "fake/beta" and chosen["resolvedModel"] == "beta"

    wrong = {**routing, "explicitModel": "gpt-9"}
    refused = (await rpc(http, bp.rpc_url, "session.message", {**params, "routing": wrong}))[
        "result"
    ]
    assert refused["success"] is False
    assert refused["error"] == (
        "agent fake: model 'gpt-9' is not offered (offered: fake/alpha, fake/beta)"
    )

    caps = await rpc(http, bp.rpc_url, "acp.capabilities", {})
    fake = next(a for a in caps["result"]["localAgents"] if a["id"] == "fake")
    assert fake["learned"] is True
    assert [m["id"] for m in fake["models"]] == ["fake/alpha", "fake/beta"]
    assert [m["id"] for m in fake["modes"]] == ["ask", "code"]
    assert fake["agentInfo"]["name"] == "fake-acp-agent"


async def test_provider_default_model_and_a_bad_mode(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    good = agent_provider("good", env=["FAKE_AGENT_OPTIONS=config"], model="fake/beta")
    bad = agent_provider("bad", env=["FAKE_AGENT_OPTIONS=config"], mode="yolo")
    plain = agent_provider("plain", model="anything")
    bp = await start_bridge(config=cfg(tmp_path, good, bad, plain), tmp=tmp_path)
    wd = str(tmp_path)
    ran = await turn(http, bp.rpc_url, "d1", "whoami", provider="good", workingDirectory=wd)
    assert ran["output"].startswith("model=fake/beta") and ran["agentModel"] == "fake/beta"
    failed = await turn(http, bp.rpc_url, "d2", "whoami", provider="bad", workingDirectory=wd)
    assert failed["success"] is False
    assert "mode 'yolo' is not offered (offered: ask, code)" in failed["error"]
    none = await turn(http, bp.rpc_url, "d3", "whoami", provider="plain", workingDirectory=wd)
    assert none["error"] == "agent plain: the agent offers no model selection"


# --- MCP servers -------------------------------------------------------------------------


async def test_mcp_servers_and_the_toolbridge_reach_the_agent(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    servers = [
        {
            "name": "echo",
            "command": sys.executable,
            "args": ["-V"],
            "env": ["ECHO_TOKEN=mcp-env-secret-77"],
        },
        {"name": "web", "type": "http", "url": "http://127.0.0.1:9/mcp"},
        {"name": "events", "type": "sse", "url": "http://127.0.0.1:9/sse"},
    ]
    provider = agent_provider(
        env=["FAKE_AGENT_MCP=http"], mcp_servers=servers, toolbridge=True, client_mcp_servers=True
    )
    closed = agent_provider("closed")
    bp = await start_bridge(
        "--log-level", "debug", config=cfg(tmp_path, provider, closed), tmp=tmp_path
    )
    wd = str(tmp_path)
    client = [
        {
            "name": "mine",
            "type": "http",
            "url": "http://127.0.0.1:9/x",
            "headers": [{"name": "Authorization", "value": "Bearer client-mcp-secret-9"}],
        }
    ]
    result = await turn(
        http, bp.rpc_url, "x1", "mcp", "session.start", workingDirectory=wd, mcpServers=client
    )
    assert result["output"] == "mcp: echo:stdio,web:http,xwm-toolbridge:stdio,mine:http"
    assert result["mcpServers"] == ["echo", "web", "xwm-toolbridge", "mine"]
    assert result["mcpServersSkipped"] == [
        {"name": "events", "reason": "agent does not accept sse MCP servers"}
    ]
    tools = await turn(http, bp.rpc_url, "x1", "mcp-tools xwm-toolbridge", workingDirectory=wd)
    assert tools["output"] == "tools: chat,claude_review,vault_kv"

    refused = await turn(
        http,
        bp.rpc_url,
        "x2",
        "mcp",
        "session.start",
        provider="closed",
        workingDirectory=wd,
        mcpServers=client,
    )
    assert refused["success"] is False
    assert "does not accept MCP servers from clients" in refused["error"]
    bad = await turn(
        http, bp.rpc_url, "x3", "mcp", "session.start", workingDirectory=wd, mcpServers=[{}]
    )
    assert bad["error"] == "mcpServers[0]: an object with a name is required"

    logs = "\n".join(bp.logs)
    assert "fake agent mcpServers" in logs  # the agent's stderr, logged at debug
    assert "mcp-env-secret-77" not in logs and "client-mcp-secret-9" not in logs


# --- prompt content ----------------------------------------------------------------------


async def test_attachments_and_artifacts_become_image_and_resource_blocks(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "pic.png").write_bytes(PNG)
    (root / "notes.txt").write_text("some notes")
    (root / "big.bin").write_bytes(b"\0" * 2048)
    (tmp_path / "outside.txt").write_text("secret")
    rich = agent_provider("rich", env=["FAKE_AGENT_PROMPT_CAPS=image,embeddedContext"])
    plain = agent_provider("plain")
    config = cfg(tmp_path, rich, plain)
    config["allowed_roots"] = [str(root)]
    config["limits"] = {"artifact_max_file_bytes": 1024}
    bp = await start_bridge(config=config, tmp=tmp_path)
    attachments = [
        {"name": "pic.png", "path": str(root / "pic.png")},
        {"name": "notes.txt", "path": str(root / "notes.txt")},
        {"name": "outside.txt", "path": str(tmp_path / "outside.txt")},
        {"name": "big.bin", "path": str(root / "big.bin")},
    ]
    artifacts = [
        {"label": "a.md", "contentType": "text/markdown", "encoding": "utf8", "content": "# hi"},
        {
            "label": "b.png",
            "contentType": "image/png",
            "encoding": "base64",
            "content": base64.b64encode(PNG).decode(),
        },
    ]
    extra = {"workingDirectory": str(root), "attachments": attachments, "artifacts": artifacts}
    result = await turn(http, bp.rpc_url, "i1", "blocks", "session.start", "rich", **extra)
    blocks = result["output"].removeprefix("blocks: ").split("; ")
    # the references of what could not be sent, the prompt, then the media
    assert blocks[0].startswith("text(") and blocks[1] == "text(6)"
    assert blocks[2:] == [
        f"image(image/png,{len(PNG)})",
        "resource(text/plain,10,text)",
        "resource(text/markdown,4,text)",
        f"image(image/png,{len(PNG)})",
    ]
    report = {a["name"]: a for a in result["attachments"]}
    assert report["pic.png"]["sentAs"] == "image" and report["notes.txt"]["sentAs"] == "resource"
    assert report["outside.txt"] == {
        "name": "outside.txt",
        "mimeType": "text/plain",
        "path": str(tmp_path / "outside.txt"),
        "sentAs": "text",
        "reason": "outside allowed_roots",
    }
    assert report["big.bin"]["reason"] == "larger than 1024 bytes"

    echoed = await turn(
        http, bp.rpc_url, "i2", "hello", "session.start", "plain", **extra
    )  # no image/embedded support: text references only
    out = echoed["output"]
    assert out.startswith("agent says: hello [context: User-selected local attachments:\n")
    assert f"\n- outside.txt: {tmp_path / 'outside.txt'}\n" in out
    assert {a["sentAs"] for a in echoed["attachments"]} == {"text"}


async def test_an_attachment_path_with_a_nul_is_only_referenced(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A path no file can have (a NUL in it) is a reference with a reason, not a
    failed turn with an internal error and a traceback in the log."""
    bp = await start_bridge(config=cfg(tmp_path), tmp=tmp_path)
    bad = f"{tmp_path}/a\0b.txt"
    extra = {"workingDirectory": str(tmp_path), "attachments": [{"name": "a", "path": bad}]}
    result = await turn(http, bp.rpc_url, "n1", "hello", "session.start", **extra)
    assert result["success"] is True, result
    assert result["attachments"][0]["reason"] == "not a valid path"
    assert not [line for line in bp.logs if "Traceback" in line or "embedded null" in line]


# --- usage -------------------------------------------------------------------------------


async def test_usage_per_turn_per_session_in_replay_store_and_metrics(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    provider = agent_provider(env=["FAKE_AGENT_COST=0.25", "FAKE_AGENT_OPTIONS=config"])
    env = base_env(ACP_AUTH_TOKEN=TOKEN)
    bp = await start_bridge(config=cfg(tmp_path, provider), env=env, tmp=tmp_path)
    wd = str(tmp_path)
    events = [
        e
        async for e in sse_stream(
            http, bp.rpc_url, "session.start", agent_params("u1", "one two", workingDirectory=wd)
        )
    ]
    first = events[-1]["result"]
    assert typed(events, "usage")[0]["usage"] == {
        "used": 42,
        "size": 1000,
        "cost": {"amount": 0.25, "currency": "USD"},
    }
    assert first["usage"] == {
        "inputTokens": 2,
        "outputTokens": 3,
        "totalTokens": 5,
        "cost": {"amount": 0.25, "currency": "USD"},
        "contextUsed": 42,
        "contextSize": 1000,
    }
    second = await turn(http, bp.rpc_url, "u1", "three", workingDirectory=wd)
    assert second["usage"]["inputTokens"] == 1 and second["usage"]["cost"]["amount"] == 0.25
    assert second["sessionUsage"] == {
        "inputTokens": 3,
        "outputTokens": 6,
        "totalTokens": 9,
        "cost": {"amount": 0.5, "currency": "USD"},
        "turns": 2,
    }
    replay = await rpc(http, bp.rpc_url, "session.replay", {"sessionId": "u1"})
    assert replay["result"]["usage"] == second["sessionUsage"]

    async with http.get(f"{bp.url}/metrics", headers=AUTH) as resp:
        metrics = await resp.text()
    assert 'xwm_agent_tokens_total{kind="input",model="fake/alpha",provider="fake"} 3.0' in metrics
    assert 'xwm_agent_tokens_total{kind="output",model="fake/alpha",provider="fake"} 6.0' in metrics
    assert 'xwm_agent_cost_total{currency="USD",model="fake/alpha",provider="fake"} 0.5' in metrics

    # the totals are in the store: a restarted bridge still reports them
    await bp.stop()
    bp2 = await start_bridge(config=cfg(tmp_path, provider), env=env, tmp=tmp_path)
    replay = await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "u1"})
    assert replay["result"]["usage"]["turns"] == 2
    assert replay["result"]["usage"]["cost"] == {"amount": 0.5, "currency": "USD"}
    third = await turn(http, bp2.rpc_url, "u1", "four", workingDirectory=wd)
    assert third["sessionUsage"]["turns"] == 3
