"""``xwm-bridge acp`` stopping with a turn still running. At end of input the requests
get ``limits.shutdown_grace`` once, then the turns are cancelled (the upstream told)
and the process exits 0 — not a second grace for the bridge's own drain. On SIGTERM
the drain starts; a second signal cancels the turns now and exits 1."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson
import pytest

from tests.conftest import ROOT, FakeUpstream, base_env, log_entries, wait_until
from tests.integration.acp_helpers import write_config
from tests.integration.test_acp_stdio import config

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

GRACE = 6.0


def at(entry: dict[str, object]) -> float:
    return datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()


@dataclass
class Acp:
    proc: asyncio.subprocess.Process
    stderr: Path

    def logs(self) -> list[dict[str, object]]:
        return log_entries(self.stderr.read_text().splitlines())

    async def ask(self, rid: int, method: str, params: dict[str, object]) -> dict[str, object]:
        await self.tell(rid, method, params)
        assert self.proc.stdout is not None
        return dict(orjson.loads(await asyncio.wait_for(self.proc.stdout.readline(), 20)))

    async def tell(self, rid: int, method: str, params: dict[str, object]) -> None:
        assert self.proc.stdin is not None
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        self.proc.stdin.write(orjson.dumps(frame) + b"\n")
        await self.proc.stdin.drain()


@pytest.fixture
async def acp_hanging_turn(fake_upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Acp]:
    """``xwm-bridge acp`` with one turn running on the fake upstream (``hang``)."""
    async with _acp_with_turn(fake_upstream, tmp_path, "hang") as acp:
        yield acp


@contextlib.asynccontextmanager
async def _acp_with_turn(
    fake_upstream: FakeUpstream, tmp_path: Path, prompt_text: str
) -> AsyncIterator[Acp]:
    path = write_config(tmp_path, config(fake_upstream, tmp_path, limits={"shutdown_grace": GRACE}))
    stderr = tmp_path / "acp.err"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "xwm_bridge",
            "acp",
            "--config",
            str(path),
            env=base_env(),
            cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
    acp = Acp(proc, stderr)
    try:
        await acp.ask(1, "initialize", {"protocolVersion": 1})
        new = await acp.ask(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
        sid = new["result"]["sessionId"]  # type: ignore[index]
        prompt = [{"type": "text", "text": prompt_text}]
        await acp.tell(3, "session/prompt", {"sessionId": sid, "prompt": prompt})
        await wait_until(lambda: bool(fake_upstream.state.active), within=20)
        yield acp
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_end_of_input_cancels_the_turns_after_one_grace(
    acp_hanging_turn: Acp, fake_upstream: FakeUpstream
) -> None:
    acp = acp_hanging_turn
    assert acp.proc.stdin is not None
    acp.proc.stdin.close()
    assert await asyncio.wait_for(acp.proc.wait(), 4 * GRACE + 20) == 0
    logs = acp.logs()
    (eof,) = [e for e in logs if str(e.get("msg", "")).startswith("end of input")]
    (cancel,) = [e for e in logs if e.get("msg") == "grace period over; cancelling turns"]
    # the turns are cancelled as the requests' grace ends, not one more grace later
    assert at(cancel) - at(eof) < GRACE / 2, (eof, cancel)
    assert fake_upstream.state.cancels  # and the upstream was told


async def test_a_second_signal_cancels_the_turns_and_exits_1(
    acp_hanging_turn: Acp, fake_upstream: FakeUpstream
) -> None:
    """The drain ran with the signal handlers removed: a second SIGTERM killed the
    process (-15) without cancelling the turn upstream, stopping the agents or
    writing the store's queued records; and the first signal's line said grace 0."""
    acp = acp_hanging_turn
    acp.proc.send_signal(signal.SIGTERM)
    await wait_until(lambda: any(e.get("msg") == "draining" for e in acp.logs()), within=10)
    (first,) = [e for e in acp.logs() if e.get("msg") == "shutting down"]
    assert first["grace_s"] == GRACE
    acp.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(acp.proc.wait(), GRACE / 2) == 1  # not after the grace
    messages = [e.get("msg") for e in acp.logs()]
    assert "second signal: forcing the exit" in messages
    assert fake_upstream.state.cancels  # the drain's cleanup ran


async def test_sigterm_lets_a_running_prompt_finish_and_answers_it(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """SIGTERM drains: the running turn may finish within the grace, and its
    ``session/prompt`` answer reaches the client before the process exits 0."""
    async with _acp_with_turn(fake_upstream, tmp_path, "slow:1500 finish me") as acp:
        acp.proc.send_signal(signal.SIGTERM)
        assert acp.proc.stdout is not None
        answer: dict[str, object] = {}
        while not answer:
            line = await asyncio.wait_for(acp.proc.stdout.readline(), 20)
            assert line, "stdout closed before the prompt's answer: " + repr(acp.logs()[-5:])
            frame = orjson.loads(line)
            if frame.get("id") == 3:
                answer = frame
        assert answer.get("result") == {"stopReason": "end_turn"}, answer
        assert await asyncio.wait_for(acp.proc.wait(), GRACE + 20) == 0
