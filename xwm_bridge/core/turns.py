"""The turn pipeline run at the head of a thread queue (forwarding.md §3)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import STARTED_UPDATE, Notify, TurnContext
from xwm_bridge.core.executors import Executor
from xwm_bridge.core.params import SessionParams
from xwm_bridge.core.sessions import SessionRegistry, TurnHandle
from xwm_bridge.core.supervisor import Supervisor
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.observability import context as obs
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.router.resolver import GATEWAY, MULTI_AGENT, RoutingDecision, RoutingRequest
from xwm_bridge.router.service import Router
from xwm_bridge.store.base import CANCELLED, COMPLETED, FAILED, INTERRUPTED, RUNNING

log = logging.getLogger("xwm_bridge.turns")
ROUTING_REQUIRED = "ROUTING_REQUIRED"
MODE_OF_TARGET = {GATEWAY: "gateway-chat", MULTI_AGENT: "multi-agent"}

_last_turn_ns = 0


def new_turn_id() -> str:
    """``turn-<unix-nanoseconds>``, strictly increasing within the process."""
    global _last_turn_ns
    now = max(time.time_ns(), _last_turn_ns + 1)
    _last_turn_ns = now
    return f"turn-{now}"


def execution_params(params: dict[str, Any], decision: RoutingDecision) -> dict[str, Any]:
    """§3.4: the request params extended with the routing decision."""
    out = dict(params)
    out["mode"] = MODE_OF_TARGET.get(decision.execution_target, "single-agent")
    if decision.provider_id:
        out["provider"] = decision.provider_id
    if decision.gateway_provider_id:
        out["gatewayProvider"] = decision.gateway_provider_id
    if decision.model:
        out["model"] = decision.model
    if decision.skills:
        out["selectedSkills"] = list(decision.skills)
    fields = decision.fields()
    for key in (
        "resolvedExecutionTarget",
        "resolvedProviderId",
        "resolvedGatewayProviderId",
        "resolvedModel",
        "resolvedSkills",
    ):
        out[key] = fields[key]
    return out


def turn_status(result: dict[str, Any] | None, handle: TurnHandle) -> str:
    if result is None:
        return CANCELLED if handle.cancel_requested else FAILED
    if handle.cancel_requested or result.get("cancelled") is True:
        return CANCELLED
    return COMPLETED if result.get("success") is not False else FAILED


class TurnRunner:
    def __init__(
        self,
        config: BridgeConfig,
        sessions: SessionRegistry,
        supervisor: Supervisor,
        executors: Mapping[str, Executor],
        metrics: Metrics,
        router: Router | None = None,
    ) -> None:
        self._config = config
        self._sessions = sessions
        self._supervisor = supervisor
        self._executors = executors
        self._metrics = metrics
        self._router = router or Router(config, None)

    async def run(
        self,
        method: str,
        sp: SessionParams,
        notify: Notify | None,
        principal: str = "",
        *,
        request_id: str = "",
    ) -> dict[str, Any]:
        """Run one turn at the head of its thread queue (in the thread's worker task)."""
        # the worker serves many requests in turn: label its log lines with this one
        obs.request_id.set(request_id)
        obs.turn_id.set("")
        req = RoutingRequest.parse(sp.raw)
        if req is None:
            raise RpcError(INVALID_PARAMS, ROUTING_REQUIRED)
        decision = await self._router.resolve(req)
        if decision.unavailable:
            return {
                "success": False,
                "error": decision.unavailable_message,
                **decision.fields(),
            }
        exec_params = execution_params(sp.raw, decision)
        session = await self._sessions.load(sp.session_id, sp.thread_id)
        provider = coerce.text(exec_params.get("provider"))
        if provider:
            session.provider = provider
        session.add_prompt(sp.task_prompt)
        turn_id = new_turn_id()
        obs.turn_id.set(turn_id)
        session.last_turn_id, session.last_turn_status = turn_id, RUNNING
        self._sessions.persist(session)
        registry = self._sessions

        def ledger(message: dict[str, Any], relayed: bool) -> None:
            registry.record(session, turn_id, message, relayed)

        ctx = TurnContext(
            method=method,
            session=session,
            session_id=sp.session_id,
            turn_id=turn_id,
            exec_params=exec_params,
            notify=notify,
            supervisor=self._supervisor,
            principal=principal,
            ledger=ledger,
        )
        executor = self._executors[exec_params["mode"]]
        handle = TurnHandle(sp.session_id, turn_id)
        self._sessions.turn_started(handle)
        started = time.monotonic()
        result: dict[str, Any] | None = None
        try:
            await ctx.emit(dict(STARTED_UPDATE))
            result = await self._execute(executor, ctx, handle)
        finally:
            self._sessions.turn_finished(handle)
            session.last_used = time.monotonic()
            if session.last_turn_id == turn_id:  # not reset by a session.start meanwhile
                status = turn_status(result, handle)
                if status == CANCELLED and self._supervisor.closing:
                    status = INTERRUPTED  # cancelled by the shutdown, not by the client
                session.last_turn_status = status
                self._sessions.persist(session)
        elapsed = time.monotonic() - started
        self._metrics.turn_seconds.labels(decision.execution_target, provider).observe(elapsed)
        log.info(
            "turn finished",
            extra={
                "session_id": sp.session_id,
                "mode": exec_params["mode"],
                "route": decision.reason,
                "provider": provider,
                "success": result.get("success"),
                "duration_ms": round(elapsed * 1000, 1),
            },
        )
        result.update(decision.fields())
        # routing.md §6.5, with the fix: a failed write is logged, the result stands
        await self._router.record(req, decision, result)
        return result

    async def _execute(
        self, executor: Executor, ctx: TurnContext, handle: TurnHandle
    ) -> dict[str, Any]:
        if handle.cancel_requested:
            return await executor.cancelled(ctx)
        task = asyncio.get_running_loop().create_task(
            executor.execute(ctx), name=f"turn:{ctx.turn_id}"
        )
        handle.task = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not handle.cancel_requested:
                raise  # shutdown, not a client's session.cancel
            return await executor.cancelled(ctx)
