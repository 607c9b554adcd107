"""Sessions survive restarts of the real daemon (issue 6): clean SIGTERM and SIGKILL
mid-turn, with the default SQLite store under a per-test state dir."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    provider_env,
    rpc,
    session_params,
    sse,
    updates,
    wait_until,
)
from tests.integration.agent_helpers import agent_params, agent_provider

pytestmark = pytest.mark.asyncio


def stored(state: Path, session_id: str) -> dict[str, Any]:
    """The session row as the daemon left it on disk."""
    db = sqlite3.connect(state / "sessions.db")
    try:
        db.row_factory = sqlite3.Row
        row = db.execute("SELECT * FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        assert row is not None, f"session {session_id} not persisted"
        out = dict(row)
        prompts = db.execute(  # layout 4: one row per prompt, the session row says which
            "SELECT prompt FROM history WHERE session_id = ? AND n >= ? AND n < ? ORDER BY n",
            (session_id, out["history_from"], out["prompts"]),
        ).fetchall()
        assert out["history"] == b"[]" or out["history"] == "[]"
        out["history"] = [p for (p,) in prompts]
        out["upstream"] = dict(orjson.loads(out["upstream"]))
        return out
    finally:
        db.close()


def committed(state: Path, session_id: str, turn_id: str, seq: int) -> bool:
    """Whether the running turn ``turn_id`` and its update ``seq`` are on disk."""
    db = sqlite3.connect(state / "sessions.db")
    try:
        row = db.execute(
            "SELECT last_turn_id FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        messages = db.execute(
            "SELECT message FROM ledger WHERE session_id = ? AND turn_id = ?",
            (session_id, turn_id),
        ).fetchall()
    finally:
        db.close()
    # a row holds one entry, or a JSON array of the frames of one relay batch
    decoded = [orjson.loads(m) for (m,) in messages]
    entries = [e for d in decoded for e in (d if isinstance(d, list) else [d])]
    seqs = {e.get("params", {}).get("seq") for e in entries}
    return row is not None and row[0] == turn_id and seq in seqs


async def test_clean_restart_continues_the_session(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = provider_env(fake_upstream.url, XWM_STATE_DIR=str(state))
    bp = await start_bridge(env=env)
    first = updates(await sse(http, bp.rpc_url, "session.start", session_params("p1", "one")))
    second = updates(await sse(http, bp.rpc_url, "session.message", session_params("p1", "two")))
    last_seq = second[-1]["seq"]
    assert [u["seq"] for u in first + second] == list(range(1, last_seq + 1))
    assert await bp.stop(signal.SIGTERM) == 0

    row = stored(state, "p1")
    assert row["history"] == ["one", "two"] and row["provider"] == "codex"
    assert row["last_turn_status"] == "completed"

    bp2 = await start_bridge(env=env)
    third = updates(await sse(http, bp2.rpc_url, "session.message", session_params("p1", "three")))
    # seq continues where the previous process stopped; thread id is kept
    assert third[0]["seq"] == last_seq + 1
    assert all(u["threadId"] == "p1" for u in third)
    replay = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "p1"}))["result"]
    replayed = [u["seq"] for u in updates(replay["notifications"])]
    assert replayed == list(range(1, third[-1]["seq"] + 1))
    assert replay["lastSeq"] == third[-1]["seq"] and replay["lastTurnStatus"] == "completed"
    assert await bp2.stop(signal.SIGTERM) == 0
    assert stored(state, "p1")["history"] == ["one", "two", "three"]


async def test_sigkill_mid_turn_reports_the_turn_interrupted(
    start_bridge_process: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = provider_env(fake_upstream.url, XWM_STATE_DIR=str(state))
    bp = await start_bridge_process(env=env)
    done = await rpc(http, bp.rpc_url, "session.start", session_params("k1", "warm up"))
    assert done["result"]["success"] is True

    seen: list[dict[str, Any]] = []

    async def slow_turn() -> None:
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session.message",
            "params": session_params("k1", "slow:30000 long job"),
        }
        headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"}
        async with http.post(bp.rpc_url, data=orjson.dumps(body), headers=headers) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    seen.append(orjson.loads(line[6:]))

    client = asyncio.get_running_loop().create_task(slow_turn())
    await wait_until(lambda: "k1" in fake_upstream.state.active and bool(seen), within=10)
    running_turn = seen[0]["params"]["turnId"]
    # kill -9 once the store thread has committed the running turn (the session row naming
    # it, its first update), as read from the file by another connection
    await wait_until(lambda: committed(state, "k1", running_turn, seen[0]["params"]["seq"]))
    await bp.stop(signal.SIGKILL)
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(client, 10)

    bp2 = await start_bridge_process(env=env)
    replay = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "k1"}))["result"]
    assert replay["found"] is True
    assert replay["lastTurnId"] == running_turn
    assert replay["lastTurnStatus"] == "interrupted"
    last = replay["notifications"][-1]["params"]
    assert last["turnId"] == running_turn and last["interrupted"] is True
    assert last["error"] is True and last["pending"] is False
    assert any(e["params"].get("seq") == seen[0]["params"]["seq"] for e in replay["notifications"])
    assert any("turns interrupted by the last shutdown" in line for line in bp2.logs)
    got = (await rpc(http, bp2.rpc_url, "session.get", {"sessionId": "k1"}))["result"]
    statuses = [(t["turnId"], t["status"]) for t in got["turns"]]
    assert statuses[-1] == (running_turn, "interrupted")  # not "running" forever

    # the session continues after the interrupted turn
    nxt = updates(await sse(http, bp2.rpc_url, "session.message", session_params("k1", "again")))
    assert nxt[0]["seq"] == last["seq"] + 1
    # catch-up from a seq: only what came after it
    tail = (
        await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "k1", "afterSeq": last["seq"]})
    )["result"]["notifications"]
    assert [u["seq"] for u in updates(tail)] == [u["seq"] for u in nxt]
    assert await bp2.stop(signal.SIGTERM) == 0
    row = stored(state, "k1")
    assert row["history"] == ["warm up", "slow:30000 long job", "again"]


async def test_session_start_resets_the_stored_session(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = provider_env(fake_upstream.url, XWM_STATE_DIR=str(state))
    bp = await start_bridge(env=env)
    await rpc(http, bp.rpc_url, "session.start", session_params("r1", "one"))
    await rpc(http, bp.rpc_url, "session.start", session_params("r1", "fresh"))
    await bp.stop(signal.SIGTERM)
    row = stored(state, "r1")
    assert row["history"] == ["fresh"]
    bp2 = await start_bridge(env=env)
    replay = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "r1"}))["result"]
    assert replay["notifications"][0]["params"]["seq"] == 1
    assert {n["params"]["turnId"] for n in replay["notifications"]} == {replay["lastTurnId"]}
    await rpc(http, bp2.rpc_url, "session.close", {"sessionId": "r1"})
    gone = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "r1"}))["result"]
    assert gone["found"] is False and gone["notifications"] == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "sessionId is required"),
        ({"sessionId": "x", "afterSeq": "3"}, "afterSeq must be a non-negative integer"),
        ({"sessionId": "x", "afterSeq": -1}, "afterSeq must be a non-negative integer"),
        ({"sessionId": "x", "afterSeq": True}, "afterSeq must be a non-negative integer"),
        ({"sessionId": "x", "limit": 0}, "limit must be a positive integer"),
    ],
)
async def test_replay_rejects_bad_params(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    params: dict[str, Any],
    message: str,
) -> None:
    bp = await start_bridge()
    reply = await rpc(http, bp.rpc_url, "session.replay", params)
    assert reply["error"] == {"code": -32602, "message": message}


async def test_stdio_agent_session_is_reloaded_after_a_restart(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    cfg = {
        "providers": [agent_provider(env=["FAKE_AGENT_LOAD_SESSION=1"])],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 20},
    }
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_STATE_DIR=str(state))
    wd = str(tmp_path)
    bp = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    first = await rpc(
        http, bp.rpc_url, "session.start", agent_params("a1", "hi", workingDirectory=wd)
    )
    acp_sid = first["result"]["agentSessionId"]
    assert await bp.stop(signal.SIGTERM) == 0
    assert stored(state, "a1")["upstream"]["acpSessionId"] == acp_sid

    bp2 = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    again = await rpc(
        http, bp2.rpc_url, "session.message", agent_params("a1", "back", workingDirectory=wd)
    )
    assert again["result"]["output"] == "agent says: back"
    # the new agent process resumed the old ACP session instead of opening a new one
    assert again["result"]["agentSessionId"] == acp_sid


async def test_sigterm_mid_turn_records_the_turn_interrupted(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """A clean shutdown that has to cancel a turn after the grace period records it as
    interrupted (not as a client's cancel), and the session continues after a restart."""
    state = tmp_path / "state"
    env = provider_env(fake_upstream.url, XWM_STATE_DIR=str(state))
    cfg = {"limits": {"shutdown_grace": 0.3}}
    bp = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    turn = asyncio.get_running_loop().create_task(
        rpc(http, bp.rpc_url, "session.start", session_params("g1", "slow:30000 long"))
    )
    await wait_until(lambda: "g1" in fake_upstream.state.active, within=10)
    assert await bp.stop(signal.SIGTERM) == 0
    reply = await asyncio.wait_for(turn, 10)
    assert reply["result"]["success"] is False
    assert stored(state, "g1")["last_turn_status"] == "interrupted"

    bp2 = await start_bridge(env=env, config=cfg, tmp=tmp_path)
    again = await rpc(http, bp2.rpc_url, "session.message", session_params("g1", "next"))
    assert again["result"]["success"] is True
    replay = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "g1"}))["result"]
    assert replay["lastTurnStatus"] == "completed"
    assert stored(state, "g1")["history"] == ["slow:30000 long", "next"]


async def test_memory_backend_writes_nothing(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = provider_env(fake_upstream.url, XWM_STATE_DIR=str(state), XWM_SESSION_STORE="memory")
    bp = await start_bridge(env=env)
    await rpc(http, bp.rpc_url, "session.start", session_params("m1", "one"))
    replay = (await rpc(http, bp.rpc_url, "session.replay", {"sessionId": "m1"}))["result"]
    assert replay["found"] is True and replay["notifications"]  # the ledger is in memory
    await bp.stop(signal.SIGTERM)
    assert not state.exists()
    bp2 = await start_bridge(env=env)
    gone = (await rpc(http, bp2.rpc_url, "session.replay", {"sessionId": "m1"}))["result"]
    assert gone["found"] is False


async def test_a_second_daemon_on_the_same_state_directory_exits_clearly(
    start_bridge_process: StartBridge, tmp_path: Path
) -> None:
    """Issue 15 item 12: the second `serve` on a locked SQLite store exits 2 with a
    message naming the file, the holder and the fix."""
    import sys

    from tests.conftest import ROOT, TOKEN, base_env

    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_STATE_DIR=str(tmp_path / "shared"))
    first = await start_bridge_process(env=env)
    second = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "serve", "--listen", "127.0.0.1:0",
        env=env, cwd=str(ROOT),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, raw = await asyncio.wait_for(second.communicate(), 30)
    stderr = raw.decode()
    assert second.returncode == 2
    assert "is in use by another xwm-bridge process" in stderr
    assert f"pid {first.proc.pid}" in stderr
    assert "Traceback" not in stderr
