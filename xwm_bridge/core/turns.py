"""The turn pipeline run at the head of a thread queue (forwarding.md §3)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Protocol

from xwm_bridge.core.context import (
    STARTED_UPDATE,
    ClientRequests,
    Connection,
    Notify,
    NotifyMany,
    TurnContext,
)
from xwm_bridge.core.executors import Executor
from xwm_bridge.core.handles import TurnHandle
from xwm_bridge.core.journal import TurnJournal
from xwm_bridge.core.modes import Mode
from xwm_bridge.core.params import SessionParams
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.core.turn import TurnRequest
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.observability import context as obs
from xwm_bridge.observability.logging import capped, events
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.router.resolver import RoutingDecision, RoutingRequest
from xwm_bridge.store.base import CANCELLED, COMPLETED, FAILED, INTERRUPTED, RUNNING
from xwm_bridge.tasks import Supervisor

TURNS_LOGGER = "xwm_bridge.turns"
ROUTING_REQUIRED = "ROUTING_REQUIRED"

_last_turn_ns = 0


def new_turn_id() -> str:
    """``turn-<unix-nanoseconds>``, strictly increasing within the process."""
    global _last_turn_ns
    now = max(time.time_ns(), _last_turn_ns + 1)
    _last_turn_ns = now
    return f"turn-{now}"


#: ``last_turn_status`` → the ``outcome`` label of ``xwm_turn_duration_seconds``
OUTCOMES = {
    COMPLETED: "success",
    FAILED: "failed",
    CANCELLED: "cancelled",
    INTERRUPTED: "interrupted",
}


def turn_status(result: dict[str, Any] | None, handle: TurnHandle) -> str:
    if result is None:
        return CANCELLED if handle.cancel_requested else FAILED
    if handle.cancel_requested or result.get("cancelled") is True:
        return CANCELLED
    return COMPLETED if result.get("success") is not False else FAILED


class Router(Protocol):
    """Routing as the turn pipeline uses it (``router.service.Router`` implements it)."""

    async def resolve(self, req: RoutingRequest) -> RoutingDecision: ...

    async def record(
        self, req: RoutingRequest, decision: RoutingDecision, result: dict[str, Any]
    ) -> bool: ...


class TurnRunner:
    def __init__(
        self,
        sessions: SessionRegistry,
        supervisor: Supervisor,
        executors: Mapping[Mode, Executor],
        metrics: Metrics,
        router: Router,
    ) -> None:
        missing = [m.value for m in Mode if m not in executors]
        if missing:
            raise ValueError(f"no executor for mode(s): {', '.join(missing)}")
        self._sessions = sessions
        self._supervisor = supervisor
        self._executors = executors
        self._metrics = metrics
        self._router = router
        #: turn records and events for the operator views (issue 13); None = off
        self.journal: TurnJournal | None = None

    async def run(
        self,
        method: str,
        sp: SessionParams,
        notify: Notify | None,
        principal: str = "",
        *,
        request_id: str = "",
        client: ClientRequests | None = None,
        notify_many: NotifyMany | None = None,
        connection: Connection | None = None,
    ) -> dict[str, Any]:
        """Run one turn at the head of its thread queue (in the thread's worker task)."""
        # the worker serves many requests in turn: label its log lines with this one
        obs.request_id.set(request_id)
        obs.turn_id.set("")
        if self._sessions.closing(sp.session_id) is not None:
            # closed while its turn still ends (another thread's): wait for that turn
            await self._sessions.until_closed(sp.session_id)
        # another principal's session is refused before any effect (-32003)
        await self._sessions.check_owner(sp.session_id, principal)
        if method == "session.start":  # a new conversation, from this turn on
            self._sessions.reset(sp.session_id, sp.thread_id)
        routing = RoutingRequest.parse(
            sp.raw, prompt=sp.task_prompt, working_directory=sp.working_directory
        )
        if routing is None:
            raise RpcError(INVALID_PARAMS, ROUTING_REQUIRED)
        decision = await self._router.resolve(routing)
        if decision.unavailable:
            return {
                "success": False,
                "error": decision.unavailable_message,
                **decision.fields(),
            }
        turn = TurnRequest.build(method, sp, routing, decision, principal)
        session = await self._sessions.load(sp.session_id, sp.thread_id)
        self._sessions.claim(session, principal)  # -32003 on another principal's session
        provider = turn.provider
        if provider:
            session.provider = provider
        session.add_prompt(sp.task_prompt)
        turn_id = new_turn_id()
        obs.turn_id.set(turn_id)
        session.last_turn_id, session.last_turn_status = turn_id, RUNNING
        self._sessions.persist(session)
        journal = self.journal
        entry = journal.started(turn, session, turn_id) if journal is not None else None
        registry = self._sessions

        def ledger(messages: list[dict[str, Any]], relayed: bool) -> None:
            registry.record(session, turn_id, messages, relayed)

        watched = journal is not None and registry.events is not None and registry.watched()
        ctx = TurnContext(
            turn,
            session,
            turn_id,
            notify,
            self._supervisor,
            ledger,
            watched,
            client,
            notify_many,
            registry.store.writable,
            connection,
        )
        executor = self._executors[turn.mode]
        handle = TurnHandle(sp.session_id, turn_id)
        self._sessions.turn_started(handle)
        started = time.monotonic()
        result: dict[str, Any] | None = None
        status = FAILED
        try:
            await ctx.emit(STARTED_UPDATE)  # emit copies it into the update
            result = await self._execute(executor, ctx, handle)
        finally:
            self._sessions.turn_finished(handle)
            session.last_used = time.monotonic()
            status = turn_status(result, handle)
            if status == CANCELLED and self._supervisor.closing:
                status = INTERRUPTED  # cancelled by the shutdown, not by the client
            if session.last_turn_id == turn_id:  # not reset by a session.start meanwhile
                session.last_turn_status = status
                self._sessions.persist(session)
            if journal is not None and entry is not None:
                current = self._sessions.get(sp.session_id) is session  # not reset meanwhile
                journal.finished(entry, session, status, result, store=current)
            elapsed = time.monotonic() - started
            outcome = OUTCOMES[status]
            mode = turn.mode.value
            # the routed provider (a configured id), never the client's own ``provider``
            # string: a label value per client-chosen string would grow /metrics unbounded
            self._metrics.turn_durations.get(
                decision.execution_target, mode, decision.provider_id, outcome
            ).observe(elapsed)
        fields = {
            "session_id": sp.session_id[:128],
            "mode": mode,
            "route": decision.reason,
            "provider": provider,
            "success": result.get("success"),
            "outcome": outcome,
            "duration_ms": round(elapsed * 1000, 1),
        }
        if outcome == "success":
            events.info(TURNS_LOGGER, "turn finished", fields)
        else:
            fields["error"] = capped(str(result.get("error") or ""), 500)
            # a failed turn is a warning, with its reason; a cancelled one is not a failure
            line = events.warning if outcome == "failed" else events.info
            line(TURNS_LOGGER, "turn finished", fields)
        result.update(decision.fields())
        self._sessions.record_result(session, turn_id, result)  # session.replay returns it
        # routing.md §6.5 (auto-routed turns only), with the fix: a failed write is
        # logged, the result stands
        if routing.auto:
            await self._router.record(routing, decision, result)
        return result

    @staticmethod
    async def _execute(executor: Executor, ctx: TurnContext, handle: TurnHandle) -> dict[str, Any]:
        return await handle.execute(lambda: executor.execute(ctx), lambda: executor.cancelled(ctx))
