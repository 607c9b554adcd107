"""An agent process that exits while a process it started holds its pipes, and the
group it leaves behind: noticed at once, killed, on both event loops (in-process)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_acp_agent_process import alive, spec
from tests.markers import both_loops
from tests.processes import ClosedStdin
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, SessionHandlers


async def gone(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` is dead (or a zombie) within ``within`` seconds (a SIGKILL sent
    takes a moment to be delivered)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while alive(pid):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@both_loops
async def test_an_agent_exiting_while_its_child_holds_the_pipes_fails_the_turn_at_once(
    tmp_path: Path,
) -> None:
    agent = AcpAgent(spec())
    chunks: list[str] = []
    child = 0
    try:
        await agent.ensure_started()
        sid = (await agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, 10))[
            "sessionId"
        ]

        async def on_update(update: dict[str, Any]) -> None:
            chunks.append(str(update.get("content", {}).get("text", "")))

        async def on_request(method: str, params: dict[str, Any]) -> Any:
            return None

        agent.sessions[sid] = SessionHandlers(on_update, on_request)
        prompt = {"sessionId": sid, "prompt": codec.prompt_blocks("orphan 60")}
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(AgentError) as info:
            await agent.call("session/prompt", prompt, 8)
        assert not info.value.timed_out, info.value
        assert loop.time() - started < 5
        assert "exited (exit status 6)" in str(info.value)
        # what it wrote before it exited was read: its last stderr line, its chunk
        assert "its child keeps the pipes" in str(info.value)
        assert chunks and chunks[-1].startswith("orphan ")
        child = int(chunks[-1].split()[1])
        assert await gone(child)  # the child left in its group is killed
        assert not agent.alive
        assert agent.status()["lastExit"] == "exit status 6"
        # the next call starts a new process
        await agent.ensure_started()
        assert agent.generation == 2
    finally:
        await agent.close()
        if child:
            kill_quietly(child)


LEFTOVER_AGENT = """
import json, signal, subprocess, sys
line = sys.stdin.readline()
rid = json.loads(line)["id"]
# a child in the agent's group, on its stdout and stderr, that ignores SIGTERM
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": rid,
                             "result": {"protocolVersion": 1, "child": child.pid}}) + "\\n")
sys.stdout.flush()
sys.stdin.read()
"""


@both_loops
async def test_close_kills_what_the_group_left_when_the_leader_exited_on_sigterm() -> None:
    """SIGTERM ends the agent but not the child that holds its pipes: close does not
    wait ``stop_grace`` for pipes to close, and kills the child."""
    agent = AcpAgent(replace(spec([sys.executable, "-c", LEFTOVER_AGENT]), stop_grace=6.0))
    child = 0
    try:
        init = await agent.ensure_started()
        child = int(init["child"])
        assert os.getpgid(child) == agent.status()["pid"]
        loop = asyncio.get_running_loop()
        started = loop.time()
        await agent.close()
        assert loop.time() - started < 4  # not stop_grace: the leader exited at once
        assert await gone(child)
    finally:
        await agent.close()
        if child:
            kill_quietly(child)


@both_loops
async def test_close_signals_no_group_that_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the agent exited and was reaped with nothing left of its group, its number
    may be a stranger's: close sends it nothing."""
    agent = AcpAgent(spec())
    await agent.ensure_started()
    pid = agent.status()["pid"]
    sid = (await agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, 10))[
        "sessionId"
    ]
    with pytest.raises(AgentError, match="exit status 3"):
        prompt = {"sessionId": sid, "prompt": codec.prompt_blocks("crash")}
        await agent.call("session/prompt", prompt, 10)
    sent: list[tuple[int, int]] = []
    real = os.killpg

    def spy(pgid: int, sig: int) -> None:
        if pgid == pid:
            sent.append((pgid, sig))
        real(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    await agent.close()
    assert [s for s in sent if s[1] != 0] == []


async def prompt_until_exit(agent: AcpAgent, tmp_path: Path, handlers: SessionHandlers) -> str:
    """A ``permcrash`` prompt: the agent asks for a permission, then exits unanswered;
    the prompt's error."""
    await agent.ensure_started()
    sid = (await agent.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}, 10))[
        "sessionId"
    ]
    agent.sessions[sid] = handlers
    prompt = {"sessionId": sid, "prompt": codec.prompt_blocks(f"permcrash {tmp_path / 'x'}")}
    with pytest.raises(AgentError) as info:
        await agent.call("session/prompt", prompt, 10)
    return str(info.value)


async def no_update(update: dict[str, Any]) -> None:
    return None


@both_loops
async def test_the_requests_of_an_agent_that_exits_are_cancelled_at_once(tmp_path: Path) -> None:
    """A ``session/request_permission`` waiting for an operator (or an fs/terminal call)
    ended only at the next start or stop of the agent: now at its exit."""
    agent = AcpAgent(spec())
    asked, cancelled = asyncio.Event(), asyncio.Event()

    async def on_request(method: str, params: dict[str, Any]) -> Any:
        asked.set()
        try:
            await asyncio.Event().wait()  # an operator who never answers
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        error = await prompt_until_exit(agent, tmp_path, SessionHandlers(no_update, on_request))
        assert "exited (exit status 4)" in error and asked.is_set()
        # the guard only catches the bug: no start, no stop came to cancel it
        await asyncio.wait_for(cancelled.wait(), 5)
    finally:
        await agent.close()


@both_loops
async def test_an_agent_exiting_tells_its_sessions_before_their_requests_are_cancelled(
    tmp_path: Path,
) -> None:
    agent = AcpAgent(spec())
    order: list[str] = []
    done = asyncio.Event()

    async def on_request(method: str, params: dict[str, Any]) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append("cancelled")
            done.set()
            raise

    def on_exit(message: str) -> None:
        order.append(f"exit: {message}")

    try:
        handlers = SessionHandlers(no_update, on_request, on_exit)
        error = await prompt_until_exit(agent, tmp_path, handlers)
        await asyncio.wait_for(done.wait(), 5)
        assert order == [f"exit: {error}", "cancelled"]
        # a stop is not an exit of its own: the stopping side cleans up
        order.clear()
        await agent.ensure_started()
        agent.sessions = {"s": handlers}
        await agent.close()
        assert order == []
    finally:
        await agent.close()


async def test_a_write_to_an_agent_whose_stdin_is_closed_says_how_it_exited() -> None:
    """A request written just after the agent exited, its stdin pipe closed: on uvloop
    the write raised RuntimeError, which reached the turn as an internal error, instead
    of the agent's exit."""
    from types import SimpleNamespace

    agent = AcpAgent(spec())
    agent._proc = SimpleNamespace(stdin=ClosedStdin(), returncode=1)  # type: ignore[assignment]
    agent._exit_message = "agent fake exited (exit status 1)"
    agent._exited.set()
    with pytest.raises(AgentError) as info:
        await agent._write(b"{}\n")
    assert str(info.value) == "agent fake exited (exit status 1)"
