"""The one method table every transport hands its requests to (contract.md §11)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import Notify
from xwm_bridge.core.params import SessionParams, session_id_of
from xwm_bridge.core.queues import QueueFullError, ShuttingDownError, ThreadQueues
from xwm_bridge.core.replay import ReplayParams, replay
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.core.supervisor import Supervisor
from xwm_bridge.core.turns import TurnRunner
from xwm_bridge.gateway.manager import GatewayManager
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.mounts.reconcile import MountsRequest, reconcile
from xwm_bridge.observability import context as obs
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.providers.stdio.permissions import PermissionAnswer, PermissionBroker
from xwm_bridge.router.dispatch import resolve_dispatch
from xwm_bridge.router.resolver import EMPTY_FIELDS, RoutingRequest
from xwm_bridge.router.service import Router
from xwm_bridge.store.cluster import Cluster

log = logging.getLogger("xwm_bridge.dispatch")

#: Backends present in this build; capabilities never advertise the others.
MULTI_AGENT_AVAILABLE = True
GATEWAY_PROVIDERS: list[dict[str, str]] = [
    {"providerId": "local", "label": "Local"},
    {"providerId": "openclaw", "label": "OpenClaw"},
]
SHUTTING_DOWN_MESSAGE = "bridge is shutting down; retry on another replica"


@dataclass(frozen=True, slots=True)
class CallContext:
    """Per-request facts from the transport."""

    notify: Notify | None
    transport: str
    #: the authenticated caller (a digest of its bearer credential, or the transport name).
    principal: str = ""
    #: the caller's bearer credential, only ever forwarded when config says so.
    bearer: str = ""
    #: the long-lived connection (WebSocket) the call came on: ``.notify`` and ``.closed``.
    connection: Any = None


Handler = Callable[[dict[str, Any], CallContext, str], Awaitable[dict[str, Any]]]


class Dispatcher:
    def __init__(
        self,
        config: BridgeConfig,
        sessions: SessionRegistry,
        queues: ThreadQueues,
        runner: TurnRunner,
        supervisor: Supervisor,
        metrics: Metrics | None = None,
        router: Router | None = None,
        broker: PermissionBroker | None = None,
        gateway: GatewayManager | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        self._config = config
        self._router = router or Router(config, None)
        self._broker = broker or PermissionBroker()
        self._sessions = sessions
        self._queues = queues
        self._runner = runner
        self._supervisor = supervisor
        self._gateway = gateway or GatewayManager(config)
        self._cluster = cluster
        self._methods: dict[str, Handler] = {
            "acp.capabilities": self._capabilities,
            "session.start": self._session_turn,
            "session.message": self._session_turn,
            "session.cancel": self._session_cancel,
            "session.close": self._session_close,
            "xworkmate.routing.resolve": self._routing_resolve,
            "xworkmate.dispatch.resolve": self._dispatch_resolve,
            "xworkmate.mounts.reconcile": self._mounts_reconcile,
            "session.permission": self._session_permission,
            "xworkmate.gateway.connect": self._gateway_connect,
            "xworkmate.gateway.request": self._gateway_request,
            "xworkmate.gateway.disconnect": self._gateway_disconnect,
            "session.replay": self._session_replay,
        }
        self.metrics = metrics or Metrics()
        self.metrics.set_known_methods(self._methods)  # live: subclasses may add methods

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._methods)

    async def handle(self, request: jsonrpc.Request, call: CallContext) -> dict[str, Any] | None:
        """Run one request; return the response envelope, or None for a notification.

        Emits one audit log line per request with an allowlist of fields (ids,
        method, outcome, duration, target, provider, counts) — never params,
        prompts, outputs, headers or tokens.
        """
        token = obs.request_id.set(obs.new_request_id())
        started = time.monotonic()
        handler = self._methods.get(request.method)
        notes = 0
        if call.notify is not None:
            inner = call.notify

            async def counted(message: dict[str, Any]) -> None:
                nonlocal notes
                notes += 1
                await inner(message)

            call = dataclasses.replace(call, notify=counted)
        outcome, code = "ok", 0
        value: dict[str, Any] = {}
        try:
            if handler is None:
                raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"unknown method: {request.method}")
            value = await handler(request.params, call, request.method)
            response = jsonrpc.result(request.id, value)
        except RpcError as exc:
            outcome, code = "error", exc.code
            response = jsonrpc.error(request.id, exc.code, exc.message)
        except Exception:
            outcome, code = "internal_error", jsonrpc.INTERNAL_ERROR
            log.exception("method failed", extra={"method": request.method})
            response = jsonrpc.error(request.id, jsonrpc.INTERNAL_ERROR, "internal error")
        method = self.metrics.method_label(request.method)
        self.metrics.requests.labels(method, call.transport, outcome).inc()
        audit: dict[str, Any] = {
            "audit": True,
            "transport": call.transport,
            "method": method,
            "outcome": outcome,
            "duration_ms": round((time.monotonic() - started) * 1000, 1),
            "notifications": notes,
        }
        if code:
            audit["code"] = code
        session_id = coerce.text(request.params.get("sessionId"))
        if session_id:
            audit["session_id"] = session_id[:128]
        if "resolvedExecutionTarget" in value:
            audit["target"] = value.get("resolvedExecutionTarget")
            audit["provider"] = value.get("resolvedProviderId")
            audit["success"] = value.get("success")
        log.info("request", extra=audit)
        obs.request_id.reset(token)
        return None if request.is_notification else response

    async def _capabilities(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        catalog = [
            {"providerId": p.id, "label": p.label or p.id} for p in self._config.available_providers
        ]
        single = bool(catalog)
        multi = self._config.multi_agent_enabled and MULTI_AGENT_AVAILABLE
        gateways = list(GATEWAY_PROVIDERS)
        return {
            "singleAgent": single,
            "multiAgent": multi,
            "providerCatalog": catalog,
            "gatewayProviders": gateways,
            "capabilities": {
                "single_agent": single,
                "multi_agent": multi,
                "providerCatalog": catalog,
                "gatewayProviders": gateways,
            },
        }

    async def _session_turn(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        sp = SessionParams.parse(params)
        if self._supervisor.closing:
            raise RpcError(jsonrpc.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE)
        try:
            # refuse an overflowing turn before it has any effect (no session.start reset)
            self._queues.check_capacity(sp.thread_id)
        except QueueFullError as exc:
            raise RpcError(jsonrpc.QUEUE_FULL, str(exc)) from None
        if method == "session.start":
            self._sessions.reset(sp.session_id, sp.thread_id)
        self._sessions.turn_queued(sp.session_id)
        request_id = obs.request_id.get()

        def job() -> Awaitable[dict[str, Any]]:
            return self._runner.run(method, sp, call.notify, call.principal, request_id=request_id)

        try:
            if self._cluster is None:
                result: dict[str, Any] = await self._queues.submit(sp.thread_id, job)
            else:
                result = await self._clustered(sp, job)
        except QueueFullError as exc:
            raise RpcError(jsonrpc.QUEUE_FULL, str(exc)) from None
        except ShuttingDownError:
            raise RpcError(jsonrpc.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE) from None
        finally:
            self._sessions.turn_dequeued(sp.session_id)
        return result

    async def _clustered(
        self, sp: SessionParams, job: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Several replicas: a place in the thread's Redis queue, then the local queue."""
        assert self._cluster is not None
        cluster = self._cluster
        # Redis order and local order of a thread never disagree
        async with cluster.ordering(sp.thread_id):
            ticket = await cluster.enqueue(sp.thread_id, sp.session_id)
            try:
                fut = self._queues.submit_nowait(sp.thread_id, cluster.wrap(ticket, job))
            except BaseException:
                await asyncio.shield(cluster.release(ticket))
                raise
        try:
            result: dict[str, Any] = await fut
            return result
        finally:
            if not ticket.started:  # refused, skipped or abandoned before it ran
                await asyncio.shield(cluster.release(ticket))

    async def _session_cancel(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = session_id_of(params)
        cancelled = self._sessions.cancel(session_id)
        if not cancelled and self._cluster is not None:
            cancelled = await self._cluster.cancel_remote(session_id)  # running elsewhere
        return {"accepted": True, "cancelled": cancelled}

    async def _session_close(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = session_id_of(params)
        return {"accepted": True, "closed": self._sessions.close(session_id)}

    async def _routing_resolve(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """contract.md §11.5: a preflight; no session, no queue, no memory write."""
        req = RoutingRequest.parse(params)
        if req is None:
            return {"ok": True, **EMPTY_FIELDS}
        decision = await self._router.resolve(req)
        return {"ok": True, **decision.fields()}

    async def _dispatch_resolve(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return resolve_dispatch(params)

    async def _mounts_reconcile(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await reconcile(MountsRequest.parse(params), self._config.mounts)

    async def _session_permission(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """The client's answer to a ``permission`` update of a stdio agent (issue 8)."""
        return self._broker.answer(PermissionAnswer.parse(params))

    async def _gateway_connect(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._gateway.connect(
            params, call.principal, call.notify, call.connection, call.bearer
        )

    async def _gateway_request(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._gateway.request(params, call.principal, call.notify, call.connection)

    async def _gateway_disconnect(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._gateway.disconnect(params, call.principal, call.notify, call.connection)

    async def _session_replay(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """Catch-up after a disconnect (issue 6): the ledger after ``afterSeq``."""
        rp = ReplayParams.parse(params, self._config.store.replay_max_items)
        return await replay(self._sessions, rp)
