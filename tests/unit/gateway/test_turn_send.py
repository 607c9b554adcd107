"""What a gateway turn's ``chat.send`` carries, and what follows one that fails.

The turn is run on a stand-in runtime (``chat.send`` answered, or failed, as each test
says) with a stand-in client; nothing waits on a clock.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.unit.gateway.fake_runtime import TapRuntime
from xwm_bridge.config.sections import GatewayConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.turns import GatewayTurnExecutor
from xwm_bridge.tasks import Supervisor, wait_for

KEY = "agent:main:xwm-s1"


class FakeRuntime(TapRuntime):
    """The parts of a GatewayRuntime a turn uses. ``chat.send`` answers and ends the run
    at once (``final``), or raises ``send_error``; every request is kept."""

    def __init__(self, send_error: GatewayError | None = None) -> None:
        super().__init__(GatewayConfig())
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.send_error = send_error

    async def request(self, method: str, params: dict[str, Any], _deadline: float) -> Any:
        self.requests.append((method, params))
        if method == "chat.send":
            if self.send_error is not None:
                raise self.send_error
            run_id = params["idempotencyKey"]
            payload = {"sessionKey": KEY, "runId": run_id, "state": "final", "stopReason": "stop"}
            for tap in self.taps:
                tap(p.EventFrame("chat", {**payload, "message": _reply(params["message"])}, 1))
            return {"runId": run_id, "status": "started"}
        return {"aborted": True}


def _reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": f"echo: {text}"}]}


def turn_context(prompt: str, history: list[str]) -> Any:
    sent: list[dict[str, Any]] = []

    async def notify(message: dict[str, Any]) -> None:
        sent.append(message)

    session = SimpleNamespace(
        thread_id="th1", history=history, next_seq=iter(range(1, 99)).__next__
    )
    turn = SimpleNamespace(
        params=SimpleNamespace(session_id="s1", task_prompt=prompt),
        upstream={"gatewaySessionKey": KEY},
        principal="p1",
        prompt=prompt,
    )
    ctx = SimpleNamespace(
        turn=turn,
        session=session,
        turn_id="turn-1",
        notify=notify,
        supervisor=Supervisor(),
        ledger=None,
        writable=None,
        params=turn.upstream,
        session_id="s1",
        sent=sent,
    )
    ctx.emit = lambda payload: TurnContext.emit(ctx, payload)  # type: ignore[attr-defined]
    ctx.emit_error = lambda message: TurnContext.emit_error(ctx, message)  # type: ignore[attr-defined]
    return ctx


async def test_chat_send_carries_this_turn_s_prompt_not_the_session_s_latest() -> None:
    """Turns of one session on two threads run at once and share the session's prompt
    history: the other thread's prompt, added while this turn was starting (its
    ``started`` update still going out), is the history's last one. This turn's
    ``chat.send`` must carry its own ``taskPrompt``, or both turns ask the other's."""
    ctx = turn_context("mine", history=["mine", "the other thread's"])
    rt = FakeRuntime()
    executor = GatewayTurnExecutor(manager=None)  # type: ignore[arg-type]
    result = await wait_for(executor._run(ctx, rt), 5)  # type: ignore[arg-type]
    sends = [params for method, params in rt.requests if method == "chat.send"]
    assert [params["message"] for params in sends] == ["mine"]
    assert result["success"] is True and result["output"] == "echo: mine"


async def test_a_chat_send_that_timed_out_is_aborted() -> None:
    """A ``chat.send`` written but not answered within its deadline may have started
    the run (OpenClaw answers ``started`` and runs on; one whose model is down retries
    for ever, without an event). The turn ends with the timeout, and the run it may
    have started is aborted under its idempotency key (OpenClaw's ``runId``)."""
    ctx = turn_context("hi", history=["hi"])
    rt = FakeRuntime(send_error=GatewayError("chat.send request timeout", "RPC_TIMEOUT"))
    executor = GatewayTurnExecutor(manager=None)  # type: ignore[arg-type]
    result = await wait_for(executor._run(ctx, rt), 5)  # type: ignore[arg-type]
    assert rt.requests[1:] == [("chat.abort", {"sessionKey": KEY, "runId": "xwm-turn-1"})]
    assert result["success"] is False and result["error"] == "chat.send request timeout"
    assert result["aborted"] is True
    assert ctx.sent[-1]["params"]["message"] == "chat.send request timeout"


async def test_a_chat_send_the_gateway_refused_is_not_aborted() -> None:
    """An error answer started no run: nothing to abort."""
    ctx = turn_context("hi", history=["hi"])
    rt = FakeRuntime(send_error=GatewayError("bad session", "INVALID_REQUEST"))
    executor = GatewayTurnExecutor(manager=None)  # type: ignore[arg-type]
    result = await wait_for(executor._run(ctx, rt), 5)  # type: ignore[arg-type]
    assert [method for method, _ in rt.requests] == ["chat.send"]
    assert result["success"] is False and result["error"] == "bad session"
