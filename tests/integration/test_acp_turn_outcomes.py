"""How an ACP ``session/prompt`` ends: its answer once the client sent ``session/cancel``
(ACP: ``stopReason: cancelled``, whatever ended the turn), and its outcome in the audit
line and ``xwm_requests_total`` (``cancelled``, ``failed``, ``ok``, as a bridge turn's on
the HTTP path). The in-process daemon, through the official SDK's WebSocket client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError

from tests.conftest import FakeUpstream, StartBridge, log_entries, wait_until
from tests.integration.acp_helpers import prompt
from tests.integration.test_acp_remote import config, sdk_client
from xwm_bridge import jsonrpc
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.acp.sessions import AcpSession
from xwm_bridge.core.queues import ShuttingDownError
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.store.base import StoreUnavailable

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

FAILURES: dict[str, Exception] = {
    "routing": RpcError(jsonrpc.INVALID_PARAMS, "no route to provider 'gone'"),
    "store": StoreUnavailable("session store: Redis did not answer within 3s"),
    "shutdown": ShuttingDownError("the bridge is shutting down"),
    "bug": RuntimeError("a bug in the turn path"),  # answered cancelled, logged with traceback
}


def prompt_audits(bp: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in log_entries(bp.logs)
        if e.get("msg") == "request" and e.get("method") == "session/prompt"
    ]


def requests(bp: Any, outcome: str) -> float:
    value = bp.bridge.metrics.registry.get_sample_value(
        "xwm_requests_total",
        {"method": "session/prompt", "transport": "acp-ws", "outcome": outcome},
    )
    return float(value or 0)


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_a_turn_that_fails_after_the_cancel_answers_cancelled(
    failure: str,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the turn fails (a routing error, a store outage, the shutdown) only once the
    # client's session/cancel has been taken: ACP has the agent answer "cancelled"
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    entered, cancel_taken = asyncio.Event(), asyncio.Event()
    real_cancel = AcpFrontDoor.cancel

    async def cancel(front: AcpFrontDoor, session: AcpSession, principal: str) -> None:
        await real_cancel(front, session, principal)
        cancel_taken.set()

    async def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
        entered.set()
        await asyncio.wait_for(cancel_taken.wait(), 30)
        raise FAILURES[failure]

    monkeypatch.setattr(AcpFrontDoor, "cancel", cancel)
    monkeypatch.setattr(bp.bridge.runner, "run", run)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=prompt("x")))
        await asyncio.wait_for(entered.wait(), 15)
        await conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
    (audit,) = prompt_audits(bp)
    assert audit["outcome"] == "cancelled" and "code" not in audit
    assert requests(bp, "cancelled") == 1 and requests(bp, "ok") == 0
    (line,) = [r for r in caplog.records if r.getMessage().startswith("ACP prompt cancelled")]
    # an expected failure is one line; a bug keeps its traceback
    assert bool(line.exc_info) == (failure == "bug")


async def test_prompts_are_audited_ok_cancelled_and_failed_as_their_turns(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        assert (await conn.prompt(session_id=sid, prompt=prompt("fine"))).stop_reason == "end_turn"
        turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("slow:20000 x")))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        with pytest.raises(RequestError) as err:
            await conn.prompt(session_id=sid, prompt=prompt("error"))
        assert err.value.code == jsonrpc.INTERNAL_ERROR and "turn failed" in str(err.value)
    audits = prompt_audits(bp)
    assert [a["outcome"] for a in audits] == ["ok", "cancelled", "failed"]
    assert [a.get("code") for a in audits] == [None, None, jsonrpc.INTERNAL_ERROR]
    # the routed target and provider, as on a session.message audit line
    assert {(a["target"], a["provider"]) for a in audits} == {("single-agent", "codex")}
    assert [a["success"] for a in audits] == [True, False, False]
    assert [requests(bp, o) for o in ("ok", "cancelled", "failed", "error")] == [1, 1, 1, 0]
