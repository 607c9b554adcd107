"""Dispatcher: method table, error envelopes, outcomes (app/dispatcher.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from xwm_bridge import jsonrpc
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.core.context import CallContext
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.store.base import StoreUnavailable


async def test_a_store_that_cannot_answer_is_said_so_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        raise StoreUnavailable("session store: Redis at 10.0.0.5:6379 did not answer within 3s")

    metrics = Metrics()
    dispatcher = Dispatcher({"session.list": handler}, metrics)
    caplog.set_level(logging.WARNING)
    request = jsonrpc.Request("session.list", {}, 7)
    response = await dispatcher.handle(request, CallContext(None, "http"))
    assert response == jsonrpc.error(7, jsonrpc.INTERNAL_ERROR, "session store unavailable")
    assert "10.0.0.5" not in str(response)  # the store's address is the operator's, in the log
    logged = [r for r in caplog.records if r.getMessage() == "session store unavailable"]
    assert logged and logged[0].exc_info is None
    assert "10.0.0.5:6379" in getattr(logged[0], "error", "")
    outcome = metrics.registry.get_sample_value(
        "xwm_requests_total",
        {"method": "session.list", "transport": "http", "outcome": "store_unavailable"},
    )
    assert outcome == 1


async def test_a_handler_reports_how_its_turn_ended() -> None:
    # the ACP front door's session/prompt answers {stopReason} or an error: the outcome
    # and the turn's target come from what it reports, as for a session.message
    from xwm_bridge.app.dispatcher import report_turn

    turn = {"success": False, "resolvedExecutionTarget": "single-agent", "resolvedProviderId": "p"}

    async def cancelled(params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        report_turn("cancelled", turn)
        return {"stopReason": "cancelled"}

    async def failed(params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        report_turn("failed", turn)
        raise jsonrpc.RpcError(jsonrpc.INTERNAL_ERROR, "turn failed: boom")

    async def plain(params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        return {}

    metrics = Metrics()
    dispatcher = Dispatcher({"a": cancelled, "b": failed, "c": plain}, metrics)
    for method in ("a", "b", "c"):
        await dispatcher.handle(jsonrpc.Request(method, {}, 1), CallContext(None, "acp-stdio"))

    def count(method: str, outcome: str) -> float | None:
        labels = {"method": method, "transport": "acp-stdio", "outcome": outcome}
        return metrics.registry.get_sample_value("xwm_requests_total", labels)

    assert count("a", "cancelled") == 1 and count("b", "failed") == 1
    assert count("c", "ok") == 1  # a report does not outlive its request
    with pytest.raises(ValueError):
        report_turn("fine", {})


async def test_the_counted_call_keeps_every_field_of_the_transports_call() -> None:
    # the dispatcher wraps notify (to count the request's notifications) in a new
    # CallContext: every other field must reach the handler as the transport set it,
    # withdrawn included (a queued turn's withdrawal, c3825ad)
    seen: list[CallContext] = []

    async def handler(params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        seen.append(call)
        return {}

    async def notify(message: dict[str, Any]) -> None:
        return None

    async def notify_many(messages: list[dict[str, Any]]) -> None:
        return None

    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    given = CallContext(
        notify,
        "ws",
        "bearer:p",
        "token",
        None,
        "127.0.0.1:1",
        None,
        notify_many,
        withdrawn=withdrawn,
    )
    await Dispatcher({"m": handler}, Metrics()).handle(jsonrpc.Request("m", {}, 1), given)
    (call,) = seen
    assert call.notify is not notify and call.notify_many is not notify_many  # counted
    for name in CallContext.__slots__:
        if name not in ("notify", "notify_many"):
            assert getattr(call, name) is getattr(given, name), name
