"""Local agents against the scripted agent: found without config, doctor's initialize
probe, continuity after a crash, a clean environment, the bwrap sandbox and file
modes kept by ``fs/write_text_file``."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import ROOT, TOKEN, StartBridge, base_env, rpc
from tests.integration.agent_helpers import agent_params, agent_provider
from tests.markers import needs_bwrap

pytestmark = pytest.mark.asyncio

AUTO = {"routingMode": "explicit", "explicitExecutionTarget": "singleAgent"}


def fake_agent_on_path(directory: Path, name: str) -> Path:
    """An executable ``name`` that runs the scripted agent (as ``opencode acp`` would)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / name
    script.write_text(
        f'#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m internal.peers.fake_acp_agent "$@"\n'
    )
    script.chmod(0o755)
    return script


def detect_env(agent_dir: Path, **extra: str) -> dict[str, str]:
    env = {"XWM_AGENTS_DETECT": "true", "XWM_AGENTS_PATH": str(agent_dir), **extra}
    return base_env(ACP_AUTH_TOKEN=TOKEN, **env)


async def turn(
    http: aiohttp.ClientSession, url: str, params: dict[str, Any], method: str = "session.message"
) -> dict[str, Any]:
    answer = await rpc(http, url, method, params)
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


# --- found without config ----------------------------------------------------------------


async def test_an_agent_on_the_path_is_a_working_route_without_a_config_file(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    script = fake_agent_on_path(bin_dir, "opencode")
    bp = await start_bridge(env=detect_env(bin_dir))  # no --config
    caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
    # the local agent comes first and replaces the remote default of the same id
    assert caps["providerCatalog"][0] == {"providerId": "opencode", "label": "OpenCode (local)"}
    assert [p["providerId"] for p in caps["providerCatalog"]] == ["opencode", "codex", "gemini"]
    agents = {a["id"]: a for a in caps["localAgents"]}
    assert agents["opencode"]["found"] is True and agents["opencode"]["path"] == str(script)
    assert agents["opencode"]["command"] == [str(script), "acp"]
    assert agents["codex"]["found"] is False
    assert agents["codex"]["reason"].startswith(
        "codex-acp not found in agents.search_paths or PATH"
    )
    assert set(agents) == {"opencode", "gemini", "codex", "claude", "qwen", "goose"}

    # a turn with no provider named goes to the local agent
    params = {"sessionId": "d1", "taskPrompt": "hello", "routing": AUTO}
    result = await turn(http, bp.rpc_url, params, "session.start")
    assert result["success"] is True and result["provider"] == "opencode"
    assert result["output"] == "agent says: hello"
    line = next(orjson.loads(x) for x in bp.logs if '"msg":"local agents"' in x)
    assert line["found"] == {"opencode": str(script)}
    assert "codex" in line["not_found"]


async def test_config_overrides_detection(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    fake_agent_on_path(bin_dir, "opencode")
    fake_agent_on_path(bin_dir, "gemini")
    config: dict[str, Any] = {
        "providers": [agent_provider("opencode", label="Mine")],
        "agents": {"detect_skip": ["gemini"]},
    }
    bp = await start_bridge(env=detect_env(bin_dir), config=config, tmp=tmp_path)
    caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
    assert caps["providerCatalog"] == [{"providerId": "opencode", "label": "Mine"}]
    agents = {a["id"]: a for a in caps["localAgents"]}
    assert agents["opencode"]["source"] == "config"
    assert agents["gemini"]["reason"] == "skipped (agents.detect_skip)"

    off = await start_bridge(
        env=detect_env(bin_dir, XWM_AGENTS_DETECT="false"), config={}, tmp=tmp_path
    )
    caps = (await rpc(http, off.rpc_url, "acp.capabilities", {}))["result"]
    assert [p["providerId"] for p in caps["providerCatalog"]] == ["codex", "opencode", "gemini"]
    assert {a["reason"] for a in caps["localAgents"]} == {"detection off (agents.detect)"}


async def doctor(env: dict[str, str], config: Path) -> tuple[int, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "doctor",
        "--json",
        "--config",
        str(config),
        env=env,
        cwd=str(ROOT),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, orjson.loads(out)


async def test_doctor_initializes_each_stdio_agent_within_a_deadline(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_agent_on_path(bin_dir, "gemini")
    config = tmp_path / "config.yaml"
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    config.write_text(
        orjson.dumps(
            {
                "providers": [
                    agent_provider("present"),
                    agent_provider("silent", command=silent),
                    agent_provider("dead", command=[sys.executable, "-V"]),
                    agent_provider("missing", command=["no-such-agent-xyz", "acp"]),
                ],
                "agents": {"probe_timeout": 2},
            }
        ).decode()
    )
    code, doc = await doctor(detect_env(bin_dir), config)
    assert code == 1
    rows = {c["provider"]: c for c in doc["checks"] if c["check"] in ("provider", "agent")}
    assert rows["present"]["ok"] is True
    assert rows["present"]["detail"].startswith("fake-acp-agent 1 answered initialize")
    assert rows["silent"]["ok"] is False
    assert rows["silent"]["error"] == "agent silent did not answer initialize within 2s"
    assert rows["dead"]["ok"] is False and "exited (exit status 0)" in rows["dead"]["error"]
    assert rows["missing"]["error"] == "agent command not found: no-such-agent-xyz"
    # found on the search path: probed like a configured one
    assert rows["gemini"]["ok"] is True and rows["gemini"]["command"] == str(bin_dir / "gemini")
    assert rows["codex"] == {
        "check": "agent",
        "provider": "codex",
        "ok": False,
        "optional": True,
        "error": "codex-acp not found in agents.search_paths or PATH "
        "(install: npm install -g @agentclientprotocol/codex-acp)",
    }


# --- continuity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "continuity"),
    [("FAKE_AGENT_RESUME=1", "resumed"), ("FAKE_AGENT_LOAD_SESSION=1", "loaded")],
)
async def test_after_a_crash_the_session_is_resumed_or_loaded(
    flag: str,
    continuity: str,
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    config = {"providers": [agent_provider(env=[flag])], "allowed_roots": [str(tmp_path)]}
    bp = await start_bridge("--log-level", "debug", config=config, tmp=tmp_path)
    wd = str(tmp_path)
    first = await turn(http, bp.rpc_url, agent_params("r1", "hi", workingDirectory=wd))
    assert first["sessionContinuity"] == "new"
    crashed = await turn(http, bp.rpc_url, agent_params("r1", "crash", workingDirectory=wd))
    assert crashed["success"] is False
    again = await turn(http, bp.rpc_url, agent_params("r1", "back", workingDirectory=wd))
    assert again["sessionContinuity"] == continuity
    assert again["agentSessionId"] == first["agentSessionId"]
    assert again["output"] == "agent says: back"  # no replayed history
    method = "session/resume" if continuity == "resumed" else "session/load"
    assert any(f"fake agent {method} {first['agentSessionId']}" in line for line in bp.logs)


async def test_resume_after_a_bridge_restart(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = {
        "providers": [agent_provider(env=["FAKE_AGENT_RESUME=1"])],
        "allowed_roots": [str(tmp_path)],
    }
    env = base_env(ACP_AUTH_TOKEN=TOKEN)
    wd = str(tmp_path)
    bp = await start_bridge(config=config, env=env, tmp=tmp_path)
    first = await turn(http, bp.rpc_url, agent_params("b1", "hi", workingDirectory=wd))
    await bp.stop()
    bp2 = await start_bridge(config=config, env=env, tmp=tmp_path)
    again = await turn(http, bp2.rpc_url, agent_params("b1", "again", workingDirectory=wd))
    assert again["sessionContinuity"] == "resumed"
    assert again["agentSessionId"] == first["agentSessionId"]


# --- confinement -------------------------------------------------------------------------


async def test_the_agent_gets_a_clean_environment(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    provider = agent_provider(
        "gemini", env=["EXPLICIT_VAR=given"], pass_env=["MY_TOOL_*"]
    )  # a registry id: GEMINI_* / GOOGLE_* are copied
    config = {"providers": [provider], "allowed_roots": [str(tmp_path)]}
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        LLM_API_KEY="llm-bridge-secret-1",
        INTERNAL_SERVICE_TOKEN="svc-bridge-secret-2",
        UNRELATED_VAR="not for agents",
        MY_TOOL_HOME="/opt/tool",
        GEMINI_MODEL="g-model",
        GOOGLE_API_KEY=TOKEN,  # same value as the bridge's own token: withheld
        LANG="C.UTF-8",
    )
    bp = await start_bridge(config=config, env=env, tmp=tmp_path)
    wd = str(tmp_path)

    async def var(name: str) -> str:
        out = await turn(
            http, bp.rpc_url, agent_params("e1", f"env {name}", "gemini", workingDirectory=wd)
        )
        return str(out["output"]).split("=", 1)[1]

    for name in ("ACP_AUTH_TOKEN", "LLM_API_KEY", "INTERNAL_SERVICE_TOKEN", "UNRELATED_VAR"):
        assert await var(name) == "<unset>", name
    assert await var("GOOGLE_API_KEY") == "<unset>"
    assert await var("PATH") == env["PATH"] and await var("HOME") == env["HOME"]
    assert await var("LANG") == "C.UTF-8"
    assert await var("MY_TOOL_HOME") == "/opt/tool"
    assert await var("GEMINI_MODEL") == "g-model"
    assert await var("EXPLICIT_VAR") == "given"
    assert any("GOOGLE_API_KEY" in line and "bridge secret" in line for line in bp.logs)


async def test_fs_write_keeps_the_file_mode(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = {"providers": [agent_provider()], "allowed_roots": [str(tmp_path)]}
    bp = await start_bridge(config=config, tmp=tmp_path)
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o750)
    wd = str(tmp_path)
    out = await turn(
        http, bp.rpc_url, agent_params("w1", f"write {script} echo-new", workingDirectory=wd)
    )
    assert out["output"] == "written"
    assert script.read_text() == "echo-new"
    assert stat.S_IMODE(script.stat().st_mode) == 0o750
    fresh = tmp_path / "new.txt"
    await turn(http, bp.rpc_url, agent_params("w1", f"write {fresh} x", workingDirectory=wd))
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask


@needs_bwrap
async def test_bwrap_confines_the_agents_own_writes(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    state = tmp_path / "state-dir"
    # the agent's program lives under the host's /tmp, which the sandbox replaces
    launcher = fake_agent_on_path(tmp_path / "bin", "fake-agent")
    provider = agent_provider(
        command=[str(launcher)], env=[f"PYTHONPATH={ROOT}"], writable_paths=[str(state)]
    )
    state.mkdir()
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"sandbox": "bwrap"},
    }
    bp = await start_bridge(config=config, tmp=tmp_path)
    wd = str(work)

    async def say(prompt: str) -> str:
        out = await turn(http, bp.rpc_url, agent_params("s1", prompt, workingDirectory=wd))
        assert out["success"] is True, out
        return str(out["output"])

    assert await say(f"selfwrite {work / 'in.txt'} inside") == "self-written"
    assert (work / "in.txt").read_text() == "inside"
    assert await say(f"selfwrite {state / 'st.txt'} state") == "self-written"
    denied = await say(f"selfwrite {outside / 'no.txt'} escaped")
    assert denied.startswith("selfwrite error:")
    assert not (outside / "no.txt").exists()
    denied = await say(f"selfwrite {ROOT / 'escaped.txt'} escaped")
    assert "Read-only file system" in denied and not (ROOT / "escaped.txt").exists()
    # its /tmp is private
    private = Path("/tmp") / f"xwm-private-{tmp_path.name}.txt"
    assert await say(f"selfwrite {private} x") == "self-written"
    assert not private.exists()
    # the bridge's own fs/* still serves the session directory
    assert await say(f"write {work / 'via-fs.txt'} hello") == "written"
    # a directory outside allowed_roots is not bound writable for an agent: refused
    out = await turn(http, bp.rpc_url, agent_params("s2", "hi", workingDirectory=str(ROOT)))
    assert out["success"] is False and "outside allowed_roots" in out["error"], out


@needs_bwrap
async def test_bwrap_confines_the_agents_terminals_too(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A command the agent runs through ``terminal/create`` is as confined as the agent."""
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    launcher = fake_agent_on_path(tmp_path / "bin", "fake-agent")
    provider = agent_provider(command=[str(launcher)], env=[f"PYTHONPATH={ROOT}"])
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"sandbox": "bwrap", "terminal_enabled": True},
    }
    bp = await start_bridge(config=config, tmp=tmp_path)
    wd = str(work)

    async def say(prompt: str) -> str:
        out = await turn(http, bp.rpc_url, agent_params("t1", prompt, workingDirectory=wd))
        assert out["success"] is True, out
        return str(out["output"])

    assert await say(f"terminal touch {work / 'in.txt'}") == "terminal output:"
    assert (work / "in.txt").exists()
    denied = await say(f"terminal touch {outside / 'no.txt'}")
    assert "Read-only file system" in denied and not (outside / "no.txt").exists()


async def test_found_agents_on_an_exposed_listener_are_warned_about(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    fake_agent_on_path(bin_dir, "goose")
    # the in-process daemon binds loopback whatever the config says; the config decides
    exposed = await start_bridge(env=detect_env(bin_dir, ACP_LISTEN_ADDR="0.0.0.0:8787"))
    await rpc(http, exposed.rpc_url, "acp.capabilities", {})
    assert any("serve remote clients unsandboxed" in line for line in exposed.logs)
    await exposed.stop()
    local = await start_bridge(env=detect_env(bin_dir))
    await rpc(http, local.rpc_url, "acp.capabilities", {})
    assert not any("unsandboxed" in line for line in local.logs)
