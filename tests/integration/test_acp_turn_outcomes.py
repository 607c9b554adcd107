"""How an ACP ``session/prompt`` ends: its answer once the client sent ``session/cancel``
(ACP: ``stopReason: cancelled``, whatever ended the turn), and its outcome in the audit
line and ``xwm_requests_total`` (``cancelled``, ``failed``, ``ok``, as a bridge turn's on
the HTTP path). The in-process daemon, through the official SDK's WebSocket client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FakeUpstream, StartBridge
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
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_a_turn_that_fails_after_the_cancel_answers_cancelled(
    failure: str,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
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
