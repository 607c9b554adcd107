"""Requests the bridge sends to an ACP client (acp/connection.py, acp/turns.py): a
request nobody waits for any more leaves the connection's pending table."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import wait_until
from xwm_bridge.acp.connection import AcpConnection
from xwm_bridge.acp.turns import TurnRelay
from xwm_bridge.observability.metrics import Metrics


def front() -> Any:
    agents = SimpleNamespace(prompt_timeout=60.0, session_timeout=60.0)
    return SimpleNamespace(
        bridge=SimpleNamespace(metrics=Metrics()), config=SimpleNamespace(agents=agents)
    )


async def test_a_request_whose_turn_is_cancelled_otherwise_is_forgotten() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any], scope: str | None) -> None:
        sent.append(message)

    door = front()
    conn = AcpConnection(door, send, transport="stdio")
    conn.client_capabilities = {"fs": {"readTextFile": True}}
    session = SimpleNamespace(session_id="s1", client=conn)
    door.connection_of = lambda s: conn
    relay = TurnRelay(door, session, [])  # type: ignore[arg-type]
    asking = asyncio.ensure_future(relay.request("fs/read_text_file", {"path": "/x"}))
    await wait_until(lambda: bool(sent))
    assert len(conn._pending) == 1
    asking.cancel()  # an operator's cancel, a shutdown: not the client's session/cancel
    with pytest.raises(asyncio.CancelledError):
        await asking
    assert conn._pending == {}  # a client that never answers leaves nothing behind


async def test_a_request_that_cannot_be_sent_is_not_left_pending() -> None:
    async def broken(message: dict[str, Any], scope: str | None) -> None:
        raise ConnectionResetError("gone")

    conn = AcpConnection(front(), broken, transport="stdio")
    with pytest.raises(ConnectionResetError):
        await conn.start_request("fs/read_text_file", {"sessionId": "s1"}, "s1")
    assert conn._pending == {}
