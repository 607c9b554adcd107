"""A gateway turn's ``turn_timeout`` holds while a delivery to the client is stalled.

The deadline was checked only at the top of the stream's loop: a ``session.update``
in progress at the deadline held the turn for as long as that delivery took (up to
``limits.notification_send_timeout`` per write, more behind other writers on the same
connection, and again for each event already queued).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tests.unit.gateway.fake_runtime import TapRuntime
from xwm_bridge.config.sections import GatewayConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.turns import GatewayTurnExecutor
from xwm_bridge.tasks import Supervisor, wait_for
from xwm_bridge.transport.notify import OrderedSender

KEY = "agent:main:xwm-s1"


class FakeRuntime(TapRuntime):
    """The parts of a GatewayRuntime a turn uses: ``chat.send`` queues one delta."""

    def __init__(self, turn_timeout: float) -> None:
        super().__init__(GatewayConfig(turn_timeout=turn_timeout))
        self.requests: list[str] = []

    async def request(self, method: str, params: dict[str, Any], _deadline: float) -> Any:
        self.requests.append(method)
        if method == "chat.send":
            for tap in self.taps:
                payload = {"sessionKey": KEY, "runId": "r1", "state": "delta", "deltaText": "hi"}
                tap(p.EventFrame("chat", payload, 1))
            return {"runId": "r1"}
        return {"aborted": True}


class StalledClient:
    """A client that stops reading: a write of a delta never completes (the sender's
    own deadline, 30 s, is far off); other writes go through."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.delta_stalled = asyncio.Event()

    async def write(self, data: bytes) -> None:
        if b'"delta"' in data:
            self.delta_stalled.set()
            await asyncio.Event().wait()
        self.sent.append(data)


async def test_the_turn_deadline_cuts_a_stalled_delivery() -> None:
    client = StalledClient()
    sender = OrderedSender(client.write, timeout=30.0)
    session = SimpleNamespace(
        thread_id="th1", history=["hello"], next_seq=iter(range(1, 99)).__next__
    )
    turn = SimpleNamespace(
        params=SimpleNamespace(session_id="s1"),
        upstream={"gatewaySessionKey": KEY},
        principal="p1",
        prompt="hello",
    )
    ctx = SimpleNamespace(
        turn=turn,
        session=session,
        turn_id="turn-1",
        notify=sender.send,
        supervisor=Supervisor(),
        ledger=None,
        writable=None,
        params=turn.upstream,
        session_id="s1",
    )
    ctx.emit = lambda payload: TurnContext.emit(ctx, payload)  # type: ignore[attr-defined]
    ctx.emit_error = lambda message: TurnContext.emit_error(ctx, message)  # type: ignore[attr-defined]
    rt = FakeRuntime(turn_timeout=0.3)
    executor = GatewayTurnExecutor(manager=None)  # type: ignore[arg-type]
    result = await wait_for(executor._run(ctx, rt), 5)  # type: ignore[arg-type]
    assert client.delta_stalled.is_set()
    assert result["timedOut"] is True and result["aborted"] is True
    assert rt.requests == ["chat.send", "chat.abort"]
    assert any(b"gateway turn timed out after 0.3s" in data for data in client.sent)
    sender.close()
