"""``xwm-bridge acp`` at end of input with a turn still running: the requests get
``limits.shutdown_grace`` once, then the turns are cancelled (the upstream told) and
the process exits 0 — not a second grace for the bridge's own drain."""

from __future__ import annotations

import asyncio
import sys
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


async def test_end_of_input_cancels_the_turns_after_one_grace(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = write_config(tmp_path, config(fake_upstream, tmp_path, limits={"shutdown_grace": GRACE}))
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
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def ask(rid: int, method: str, params: dict[str, object]) -> dict[str, object]:
        assert proc.stdin is not None and proc.stdout is not None
        frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        proc.stdin.write(orjson.dumps(frame) + b"\n")
        await proc.stdin.drain()
        return dict(orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20)))

    await ask(1, "initialize", {"protocolVersion": 1})
    new = await ask(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
    sid = new["result"]["sessionId"]  # type: ignore[index]
    prompt = [{"type": "text", "text": "hang"}]
    frame = {"jsonrpc": "2.0", "id": 3, "method": "session/prompt"}
    proc.stdin.write(orjson.dumps({**frame, "params": {"sessionId": sid, "prompt": prompt}}))
    proc.stdin.write(b"\n")
    await proc.stdin.drain()
    await wait_until(lambda: bool(fake_upstream.state.active), within=20)
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 4 * GRACE + 20) == 0
    logs = log_entries((await proc.stderr.read()).decode().splitlines())
    (eof,) = [e for e in logs if str(e.get("msg", "")).startswith("end of input")]
    (cancel,) = [e for e in logs if e.get("msg") == "grace period over; cancelling turns"]
    # the turns are cancelled as the requests' grace ends, not one more grace later
    assert at(cancel) - at(eof) < GRACE / 2, (eof, cancel)
    assert fake_upstream.state.cancels  # and the upstream was told
