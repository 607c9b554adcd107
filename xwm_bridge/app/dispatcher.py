"""The one dispatcher every transport hands its requests to: a method table, the
per-request audit line and the request metrics. No method logic lives here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.core.context import CallContext, Handler
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.observability import context as obs
from xwm_bridge.observability.logging import events
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.store.base import StoreUnavailable

log = logging.getLogger("xwm_bridge.dispatch")
AUDIT_LOGGER = "xwm_bridge.dispatch"
#: the answer to a request whose store read failed (the log line says why)
STORE_UNAVAILABLE = "session store unavailable"
#: outcomes a handler may report for the turn it answered (see :func:`report_turn`)
TURN_OUTCOMES = frozenset(("ok", "cancelled", "failed"))

#: what the running handler reported of its turn: ``(outcome, bridge turn result)``
_turn: ContextVar[tuple[str, Mapping[str, Any]] | None] = ContextVar("xwm_turn", default=None)


def report_turn(outcome: str, result: Mapping[str, Any]) -> None:
    """A handler that answers a bridge turn in its own terms (the ACP front door's
    ``session/prompt``: ``{stopReason}``, or a JSON-RPC error for a failed turn) says how
    it ended: ``ok``, ``cancelled`` or ``failed``, with the turn's bridge result (its
    ``resolvedExecutionTarget`` and provider, when it ran). The request's audit line and
    ``xwm_requests_total`` then read as for a ``session.message`` on HTTP. Called in the
    request's own task (the handler's), before it returns or raises."""
    if outcome not in TURN_OUTCOMES:
        raise ValueError(f"unknown turn outcome {outcome!r}")
    _turn.set((outcome, result))


class Dispatcher:
    """Runs one request through ``methods`` (``Mapping[str, Handler]``).

    Emits one audit line per request with an allowlist of fields (ids, method,
    outcome, duration, target, provider, counts) — never params, prompts,
    outputs, headers or tokens.
    """

    def __init__(self, methods: Mapping[str, Handler], metrics: Metrics) -> None:
        self._methods = dict(methods)
        self.metrics = metrics

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._methods)

    async def handle(self, request: jsonrpc.Request, call: CallContext) -> dict[str, Any] | None:
        """Run one request; return the response envelope, or None for a notification."""
        token = obs.request_id.set(obs.new_request_id())
        started = time.monotonic()
        counter: list[int] | None = None
        if call.notify is not None:
            counter = [0]
            inner = call.notify

            async def counted(message: dict[str, Any]) -> None:
                counter[0] += 1
                await inner(message)

            many = call.notify_many
            counted_many = None
            if many is not None:

                async def counted_many(messages: list[dict[str, Any]]) -> None:
                    counter[0] += len(messages)
                    await many(messages)

            call = CallContext(
                counted,
                call.transport,
                call.principal,
                call.bearer,
                call.connection,
                call.peer,
                call.client,
                counted_many,
                call.withdrawn,
            )
        outcome, code = "ok", 0
        value: dict[str, Any] = {}
        handler = self._methods.get(request.method)
        turn_token = _turn.set(None)
        try:
            if handler is None:
                raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"unknown method: {request.method}")
            value = await handler(request.params, call, request.method)
            response = jsonrpc.result(request.id, value)
            if value.get("success") is False and "resolvedExecutionTarget" in value:
                # a turn that ran and failed is not an "ok" request
                outcome = "cancelled" if value.get("cancelled") is True else "failed"
        except RpcError as exc:
            outcome, code = "error", exc.code
            response = jsonrpc.error(request.id, exc.code, exc.message)
        except asyncio.CancelledError:
            # the caller went away (connection closed, HTTP client gone): a turn still
            # queued is skipped, one already running goes on; audited either way
            self._audit(request, call, handler, "abandoned", 0, started, counter, value)
            _turn.reset(turn_token)
            obs.request_id.reset(token)
            raise
        except StoreUnavailable as exc:  # an outage, not a bug: no traceback
            outcome, code = "store_unavailable", jsonrpc.INTERNAL_ERROR
            log.warning(STORE_UNAVAILABLE, extra={"method": request.method, "error": str(exc)})
            response = jsonrpc.error(request.id, jsonrpc.INTERNAL_ERROR, STORE_UNAVAILABLE)
        except Exception:
            outcome, code = "internal_error", jsonrpc.INTERNAL_ERROR
            log.exception("method failed", extra={"method": request.method})
            response = jsonrpc.error(request.id, jsonrpc.INTERNAL_ERROR, "internal error")
        facts: Mapping[str, Any] = value
        turn = _turn.get()
        _turn.reset(turn_token)
        if turn is not None and outcome in ("ok", "error"):
            # the turn's own end, answered as a result or as an error; its target and
            # provider go into the audit line
            outcome, facts = turn[0], turn[1]
        self._audit(request, call, handler, outcome, code, started, counter, facts)
        obs.request_id.reset(token)
        return None if request.is_notification else response

    def _audit(
        self,
        request: jsonrpc.Request,
        call: CallContext,
        handler: Handler | None,
        outcome: str,
        code: int,
        started: float,
        counter: list[int] | None,
        value: Mapping[str, Any],
    ) -> None:
        method = request.method if handler is not None else "other"
        self.metrics.request_outcomes.get(method, call.transport, outcome).inc()
        audit: dict[str, Any] = {
            "audit": True,
            "transport": call.transport,
            "method": method,
            "outcome": outcome,
            "duration_ms": round((time.monotonic() - started) * 1000, 1),
            "notifications": counter[0] if counter is not None else 0,
        }
        if code:
            audit["code"] = code
        session_id = request.params.get("sessionId")
        if session_id is not None:
            session_id = coerce.text(session_id)
            if session_id:
                audit["session_id"] = session_id[:128]
        if "resolvedExecutionTarget" in value:
            audit["target"] = value.get("resolvedExecutionTarget")
            audit["provider"] = value.get("resolvedProviderId")
            audit["success"] = value.get("success")
        events.info(AUDIT_LOGGER, "request", audit)
