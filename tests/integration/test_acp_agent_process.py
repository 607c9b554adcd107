"""The ACP stdio client against the scripted agent process, in-process (no daemon)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.agent_helpers import FAKE_AGENT
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, AgentSpec, SessionHandlers

pytestmark = pytest.mark.asyncio


def spec(argv: list[str] | None = None, **env: str) -> AgentSpec:
    return AgentSpec(
        name="fake",
        argv=tuple(argv or FAKE_AGENT),
        env={"PYTHONPATH": str(ROOT), **env},
        cwd=str(ROOT),
        capabilities=codec.client_capabilities(fs_read=True, fs_write=True, terminal=False),
        initialize_timeout=20,
        stop_grace=0.5,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"


async def test_close_kills_the_group_of_an_agent_ignoring_eof_and_sigterm() -> None:
    agent = AcpAgent(spec(FAKE_AGENT_IGNORE_EOF="1"))
    init = await agent.ensure_started()
    assert init["agentInfo"]["name"] == "fake-acp-agent"
    proc = agent._proc
    assert proc is not None
    pid = proc.pid
    assert os.getpgid(pid) == pid  # its own process group
    await agent.close()
    assert not alive(pid)


async def test_ids_match_out_of_order_and_errors_surface(tmp_path: Path) -> None:
    agent = AcpAgent(spec())
    try:
        await agent.ensure_started()
        a, b = await asyncio.gather(
            agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, 10),
            agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, 10),
        )
        assert a["sessionId"] != b["sessionId"]
        with pytest.raises(AgentError) as info:
            await agent.call("nope/method", {}, 10)
        assert info.value.code == -32601
        # agent→client requests with id 0 and string ids are answered by the session handler
        seen: list[Any] = []

        async def on_request(method: str, params: dict[str, Any]) -> Any:
            seen.append(method)
            return {"content": "from handler"}

        async def on_update(update: dict[str, Any]) -> None:
            seen.append(update.get("sessionUpdate"))

        sid = a["sessionId"]
        agent.sessions[sid] = SessionHandlers(on_update, on_request)
        answer = await agent.call(
            "session/prompt", {"sessionId": sid, "prompt": codec.prompt_blocks("read /x")}, 10
        )
        assert answer["stopReason"] == "end_turn"
        assert seen == ["fs/read_text_file", "agent_message_chunk"]
    finally:
        await agent.close()


async def test_start_failure_and_initialize_deadline() -> None:
    missing = AcpAgent(spec(["/nonexistent/agent-binary"]))
    with pytest.raises(AgentError, match="cannot start agent"):
        await missing.ensure_started()
    silent = AcpAgent(
        AgentSpec(
            name="silent",
            argv=(sys.executable, "-c", "import time; time.sleep(60)"),
            env={},
            cwd="",
            capabilities={},
            initialize_timeout=0.5,
            stop_grace=0.5,
        )
    )
    with pytest.raises(AgentError) as info:
        await silent.ensure_started()
    assert info.value.timed_out
    assert not silent.alive
    await silent.close()


HUGE_LINE_AGENT = """
import json, sys
line = sys.stdin.readline()
rid = json.loads(line)["id"]
sys.stdout.write("x" * (65 * 1024 * 1024) + "\\n")
answer = {"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


async def test_a_line_over_64_mib_is_dropped_and_the_stream_goes_on() -> None:
    agent = AcpAgent(spec([sys.executable, "-c", HUGE_LINE_AGENT]))
    try:
        init = await agent.ensure_started()
        assert init == {"protocolVersion": 1}
        assert agent.dropped_lines == 1
        assert agent.alive
    finally:
        await agent.close()
