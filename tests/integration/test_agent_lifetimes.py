"""Local agents' lifetimes on the real launch path: found on ``PATH`` with no config,
a binary gone after discovery, an agent that never answers ``initialize``, and the
bridge's shutdown stopping every process of every agent (plain and bwrap'd, an agent
ignoring SIGTERM, terminals it left running)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import ROOT, TOKEN, StartBridge, base_env, rpc, wait_until
from tests.integration.agent_helpers import agent_params, agent_provider
from tests.integration.test_agent_secrets import environs_with
from tests.integration.test_local_agents import fake_agent_on_path, turn
from tests.markers import needs_bwrap

pytestmark = pytest.mark.asyncio

AUTO = {"routingMode": "explicit", "explicitExecutionTarget": "singleAgent"}


async def test_found_on_path_without_config_then_gone(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    script = fake_agent_on_path(bin_dir, "opencode")
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_AGENTS_DETECT="true")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    bp = await start_bridge(env=env)  # no --config, no XWM_AGENTS_PATH
    caps = (await rpc(http, bp.rpc_url, "acp.capabilities", {}))["result"]
    agents = {a["id"]: a for a in caps["localAgents"]}
    assert agents["opencode"]["found"] is True and agents["opencode"]["path"] == str(script)
    first = await turn(http, bp.rpc_url, {"sessionId": "p1", "taskPrompt": "hi", "routing": AUTO})
    assert first["success"] is True and first["provider"] == "opencode", first
    # the process is closed (a restart), then its binary disappears
    await turn(http, bp.rpc_url, agent_params("p1", "crash", "opencode"))
    script.unlink()
    gone = await turn(http, bp.rpc_url, agent_params("p2", "hi", "opencode"))
    assert gone["success"] is False
    assert gone["error"] == f"cannot start agent opencode: command not found: {script}"


async def test_an_agent_silent_on_initialize_fails_the_turn_and_is_stopped(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    marker = f"xwm-silent-{uuid.uuid4().hex}"
    provider = agent_provider(
        "silent", command=["/bin/sh", "-c", "exec sleep 600"], env=[f"MARK={marker}"]
    )
    config = {"providers": [provider], "agents": {"initialize_timeout": 1, "stop_grace": 1}}
    bp = await start_bridge(config=config, tmp=tmp_path)
    out = await turn(http, bp.rpc_url, agent_params("i1", "hi", "silent"))
    assert out["success"] is False
    assert out["error"] == "agent silent did not answer initialize within 1s"
    await wait_until(lambda: not environs_with(marker), within=10)


async def check_shutdown(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path, sandbox: str
) -> None:
    marker = f"xwm-life-{uuid.uuid4().hex}"
    launcher = fake_agent_on_path(tmp_path / "bin", "fake-agent")
    work = tmp_path / "work"
    work.mkdir()
    provider = agent_provider(
        command=[str(launcher)],
        # ignores EOF and SIGTERM; PYTHONPATH keeps a checkout under /tmp visible in bwrap
        env=[f"MARK={marker}", "FAKE_AGENT_IGNORE_EOF=1", f"PYTHONPATH={ROOT}"],
    )
    agents = {"sandbox": sandbox, "terminal_enabled": True, "stop_grace": 1}
    config = {"providers": [provider], "allowed_roots": [str(tmp_path)], "agents": agents}
    bp = await start_bridge(config=config, tmp=tmp_path)
    wd = str(work)
    out = await turn(http, bp.rpc_url, agent_params("l1", "spawn sleep 600", workingDirectory=wd))
    assert str(out["output"]).startswith("spawned {'terminalId'"), out
    # the agent (and its bwrap), and the terminal (and its bwrap): all carry the marker
    await wait_until(lambda: len(environs_with(marker)) >= 2, within=10)
    await bp.stop()
    await wait_until(lambda: not environs_with(marker), within=15)


async def test_shutdown_stops_the_agent_and_its_terminals(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await check_shutdown(start_bridge, http, tmp_path, "none")


@needs_bwrap
async def test_shutdown_stops_sandboxed_agents_and_terminals(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await check_shutdown(start_bridge, http, tmp_path, "bwrap")


async def start_marked(start_bridge: StartBridge, tmp_path: Path, marker: str) -> Any:
    """A bridge whose fake agent has terminals and ``MARK=marker`` in its environment,
    which its terminals inherit (:func:`environs_with` finds them)."""
    provider = agent_provider(env=[f"MARK={marker}", f"PYTHONPATH={ROOT}"])
    agents = {"terminal_enabled": True, "prompt_timeout": 120, "stop_grace": 1}
    config = {"providers": [provider], "allowed_roots": [str(tmp_path)], "agents": agents}
    return await start_bridge(config=config, tmp=tmp_path)


async def test_an_agent_that_exits_mid_request_leaves_no_terminal_running(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The agent exits while its ``terminal/wait_for_exit`` is pending: the wait was
    served on until ``prompt_timeout`` (then killed the command), or until the next
    start or stop of the agent. Now the request is cancelled at the exit and the
    session's terminals are killed and forgotten; the turn fails as before."""
    marker = f"xwm-exit-{uuid.uuid4().hex}"
    bp = await start_marked(start_bridge, tmp_path, marker)
    wd = str(tmp_path)
    out = await turn(
        http, bp.rpc_url, agent_params("x1", "termcrash sleep 600", workingDirectory=wd)
    )
    assert out["success"] is False and "exited (exit status 7)" in out["error"], out
    # the agent is gone, and so is the terminal it left (it carries the agent's env)
    await wait_until(lambda: not environs_with(marker), within=10)
    again = await turn(http, bp.rpc_url, agent_params("x2", "hi", workingDirectory=wd))
    assert again["success"] is True, again


async def test_an_agent_that_exits_leaves_no_terminal_of_an_idle_session(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A terminal an agent left running after its turn ended (an ACP terminal lives until
    released) belongs to the agent's process: when that process exits, during another
    session's turn, the idle session's terminal is killed too, not at the bridge's
    shutdown."""
    marker = f"xwm-idle-{uuid.uuid4().hex}"
    bp = await start_marked(start_bridge, tmp_path, marker)
    wd = str(tmp_path)
    out = await turn(http, bp.rpc_url, agent_params("i1", "spawn sleep 600", workingDirectory=wd))
    assert out["success"] is True and "spawned" in out["output"], out
    # the agent and the terminal it left: two processes that carry the agent's env
    await wait_until(lambda: len(environs_with(marker)) >= 2, within=10)
    crashed = await turn(
        http, bp.rpc_url, agent_params("i2", "termcrash sleep 600", workingDirectory=wd)
    )
    assert crashed["success"] is False and "exited (exit status 7)" in crashed["error"]
    await wait_until(lambda: not environs_with(marker), within=10)
    # the failed turn is one warning, not also a "background task failed" traceback
    assert "background task failed" not in caplog.text
