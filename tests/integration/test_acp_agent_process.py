"""The ACP stdio client against the scripted agent process, in-process (no daemon)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.agent_helpers import FAKE_AGENT
from tests.markers import both_loops
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, AgentSpec, SessionHandlers

pytestmark = both_loops


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


@pytest.mark.parametrize("name", ["missing", "a-file"])
async def test_a_working_directory_that_is_not_there_is_named_as_such(
    tmp_path: Path, name: str
) -> None:
    """A provider's cwd (or a session directory) gone: the spawn's ENOENT/ENOTDIR came
    from the chdir, and the turn (and doctor) said "command not found: <the agent>"."""
    (tmp_path / "a-file").write_text("")
    cwd = str(tmp_path / name / "sub" if name == "a-file" else tmp_path / name)
    agent = AcpAgent(dataclasses.replace(spec(), cwd=cwd))
    with pytest.raises(AgentError) as info:
        await agent.ensure_started()
    assert str(info.value) == f"cannot start agent fake: working directory not found: {cwd}"
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


NOISY_AGENT = """
import json, sys
line = sys.stdin.readline()
rid = json.loads(line)["id"]
for i in range(1000):
    sys.stdout.write(f"progress {i}: not json\\n")
answer = {"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


async def test_a_flood_of_bad_lines_is_counted_not_logged_line_by_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = AcpAgent(spec([sys.executable, "-c", NOISY_AGENT]))
    caplog.set_level("WARNING", logger="xwm_bridge.agents")
    try:
        assert await agent.ensure_started() == {"protocolVersion": 1}
        assert agent.bad_lines == 1000
        logged = [r for r in caplog.records if r.getMessage().startswith("bad line")]
        # the first few say what is wrong, then one line per LOG_EVERY (with the count)
        assert 0 < len(logged) <= 6, [r.getMessage() for r in logged]
        assert getattr(logged[-1], "bad_lines", 0) == 1000
    finally:
        await agent.close()


FLOOD_AGENT = """
import json, sys
line = sys.stdin.readline()
rid = json.loads(line)["id"]
answer = {"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}}
sys.stdout.write(json.dumps(answer) + "\\n")
sys.stdout.flush()
sys.stdin.readline()  # the test's go-ahead (a notification)
for i in range(100):
    request = {"jsonrpc": "2.0", "id": 1000 + i, "method": "fs/read_text_file",
               "params": {"sessionId": "s", "path": "/x"}}
    sys.stdout.write(json.dumps(request) + "\\n")
sys.stdout.flush()
codes = []
while len(codes) < 100:
    reply = json.loads(sys.stdin.readline())
    codes.append(reply.get("error", {}).get("code", 0))
    if len(codes) == 36:  # every refusal arrived before any answer
        note = {"jsonrpc": "2.0", "method": "session/update",
                "params": {"sessionId": "s", "update": {"refused": codes.count(-32004)}}}
        sys.stdout.write(json.dumps(note) + "\\n")
        sys.stdout.flush()
note = {"jsonrpc": "2.0", "method": "session/update",
        "params": {"sessionId": "s", "update": {"answered": codes.count(0)}}}
sys.stdout.write(json.dumps(note) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


async def test_an_agent_has_at_most_64_requests_served_at_once() -> None:
    agent = AcpAgent(spec([sys.executable, "-c", FLOOD_AGENT]))
    release = asyncio.Event()
    running = 0
    most = 0
    updates: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def on_request(method: str, params: dict[str, Any]) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return {"content": ""}

    async def on_update(update: dict[str, Any]) -> None:
        await updates.put(update)

    try:
        await agent.ensure_started()
        agent.sessions["s"] = SessionHandlers(on_update, on_request)
        await agent.notify("go", {})
        assert await asyncio.wait_for(updates.get(), 20) == {"refused": 36}
        assert most == 64
        release.set()
        assert await asyncio.wait_for(updates.get(), 20) == {"answered": 64}
    finally:
        release.set()
        await agent.close()


async def test_a_request_cancelled_before_it_started_frees_its_place() -> None:
    """A restart cancels the requests being served; one cancelled before its task ran
    must not keep its place (64 such and every later request would be refused)."""
    agent = AcpAgent(spec())
    line = b'{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{"sessionId":"s"}}'
    await agent._on_line(line)
    assert agent._serving == 1
    for task in agent._requests.tasks():  # what _stop does, before the task got to run
        task.cancel()
    await asyncio.gather(*agent._requests.tasks(), return_exceptions=True)
    assert agent._serving == 0
