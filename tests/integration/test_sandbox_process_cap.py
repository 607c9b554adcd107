"""The sandbox's process cap (``agents.max_sandboxed_processes``) against calls in
flight: agent-adapter's ``gemini.raw`` and turns in other directories share it.

The adapter and its bridge run in this process, the scripted ACP agent as a real
child; ``bwrap`` is a stand-in that runs the command after ``--`` (the cap is the
executor's, whatever confines the process).
"""

from __future__ import annotations

import asyncio
import stat
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, wait_until
from tests.markers import both_loops
from xwm_bridge.adapters.agent_adapter import AdapterMethods, AdapterSettings
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.config import AgentsConfig, BridgeConfig, StoreConfig
from xwm_bridge.core.context import CallContext, Handler
from xwm_bridge.providers.stdio.agent import AcpAgent

pytestmark = both_loops

AGENT = (sys.executable, str(ROOT / "internal" / "peers" / "fake_acp_agent.py"))
CALL = CallContext(notify=None, transport="test")


@dataclass
class Adapter:
    bridge: Bridge
    table: dict[str, Handler]

    async def raw(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.table["gemini.raw"]({"method": method, "params": params}, CALL, "")

    async def turn(self, session_id: str, prompt: str, wd: Path) -> dict[str, Any]:
        params = {"sessionId": session_id, "taskPrompt": prompt, "workingDirectory": str(wd)}
        return await self.table["session.start"](params, CALL, "session.start")

    def row(self) -> dict[str, Any]:
        return self.bridge.stdio_agents.status()[0]

    def processes(self) -> dict[tuple[str, str], AcpAgent]:
        return dict(self.bridge.stdio_agents.processes._agents)


def fake_bwrap(path: Path) -> Path:
    """A ``bwrap`` that confines nothing: it runs the command after ``--`` (found on
    ``PATH``, as bwrap finds it)."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "argv = sys.argv[sys.argv.index('--') + 1 :]\n"
        "os.execvp(argv[0], argv)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


async def start(tmp_path: Path, **agents: Any) -> Adapter:
    settings = AdapterSettings(
        agent_bin=AGENT[0],
        agent_args=AGENT[1:],
        provider_id="fake",
        overrides=frozenset({"agent_bin", "agent_args"}),
    )
    base = BridgeConfig(
        store=StoreConfig("memory"),
        allowed_roots=(str(tmp_path),),
        agents=AgentsConfig(
            sandbox="bwrap",
            bwrap_path=str(fake_bwrap(tmp_path / "bwrap")),
            max_sandboxed_processes=1,
            initialize_timeout=20,
            **agents,
        ),
    )
    bridge = Bridge(settings.bridge_config(base))
    await bridge.start()
    return Adapter(bridge, AdapterMethods(bridge, settings).table())


@pytest.fixture
async def adapter(tmp_path: Path) -> AsyncIterator[Adapter]:
    ad = await start(tmp_path)
    yield ad
    await ad.bridge.close(grace=5)


async def hold_raw_prompt(ad: Adapter, tmp_path: Path) -> tuple[AcpAgent, str, asyncio.Task[Any]]:
    """A ``gemini.raw`` ``session/prompt`` that runs until its session is cancelled."""
    new = await ad.raw("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    assert new["success"] is True, new
    sid = new["response"]["result"]["sessionId"]
    [proc] = ad.processes().values()  # the adapter's own process, the only one
    prompt = {"sessionId": sid, "prompt": [{"type": "text", "text": "slow"}]}
    raw = asyncio.create_task(ad.raw("session/prompt", prompt))
    await wait_until(lambda: bool(proc._pending), within=10)  # sent, not answered
    return proc, sid, raw


async def test_the_cap_never_closes_a_process_with_a_raw_call_in_flight(
    adapter: Adapter, tmp_path: Path
) -> None:
    """The cap is reached (1) and the adapter's process has a ``gemini.raw`` running;
    a turn in another directory needs a process: it waits for a free place instead of
    closing the busy one, and runs as soon as the raw call has its answer."""
    proc, sid, raw = await hold_raw_prompt(adapter, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    turn = asyncio.create_task(adapter.turn("t1", "hello", work))
    # the turn either waits for a place or (the bug) has closed the busy process
    await wait_until(lambda: adapter.row().get("waiting") == 1 or not proc.alive, within=20)
    await proc.notify("session/cancel", {"sessionId": sid})
    answer = await asyncio.wait_for(raw, 20)
    assert answer["success"] is True, answer  # the bug: "agent fake exited (…)"
    assert answer["response"]["result"]["stopReason"] == "cancelled"
    result = await asyncio.wait_for(turn, 30)
    assert result["success"] is True and result["output"] == "agent says: hello", result
    # still a real bound: the idle adapter process made way for the turn's
    [(key, now)] = adapter.processes().items()
    assert key == ("fake", str(work)) and now is not proc and not proc.alive
    assert adapter.row()["waiting"] == 0
    # and the adapter's next raw call gets a (tracked) process once the turn is done
    again = await adapter.raw("session/new", {"cwd": str(tmp_path), "mcpServers": []})
    assert again["success"] is True, again
    assert list(adapter.processes()) == [("fake", "")]


async def test_a_call_that_finds_every_process_busy_fails_clearly(tmp_path: Path) -> None:
    """``agents.process_wait: 0``: no waiting; the call fails at once, naming the cap,
    and the busy process keeps serving its call."""
    ad = await start(tmp_path, process_wait=0)
    try:
        proc, sid, raw = await hold_raw_prompt(ad, tmp_path)
        work = tmp_path / "work"
        work.mkdir()
        result = await asyncio.wait_for(ad.turn("t1", "hello", work), 20)
        assert result["success"] is False
        assert result["error"] == (
            "all 1 sandboxed agent processes are busy "
            "(agents.max_sandboxed_processes: 1); try again when one is idle"
        ), result
        assert proc.alive and not raw.done()
        await proc.notify("session/cancel", {"sessionId": sid})
        answer = await asyncio.wait_for(raw, 20)
        assert answer["success"] is True, answer
        assert list(ad.processes()) == [("fake", "")]
    finally:
        await ad.bridge.close(grace=5)


async def test_the_cap_closing_an_idle_process_kills_the_terminals_it_left(
    tmp_path: Path,
) -> None:
    """A terminal the agent left running after its turn (an ACP terminal lives until
    released) belongs to the agent's process. When the cap closes that idle process for
    a turn in another directory, the terminal goes with it, not at the bridge's
    shutdown (nothing could read or release it any more)."""
    ad = await start(tmp_path, terminal_enabled=True, stop_grace=1)
    try:
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir()
        second.mkdir()
        out = await asyncio.wait_for(ad.turn("t1", "spawn sleep 600", first), 30)
        assert out["success"] is True and "spawned" in out["output"], out
        terminals = ad.bridge.stdio_agents.terminals
        [term] = terminals._terms.values()
        assert term.running()
        [closed] = ad.processes().values()
        result = await asyncio.wait_for(ad.turn("t2", "hello", second), 30)
        assert result["success"] is True, result
        assert list(ad.processes()) == [("fake", str(second))] and not closed.alive
        await wait_until(lambda: not term.running(), within=10)
        assert not terminals._terms
    finally:
        await ad.bridge.close(grace=5)
