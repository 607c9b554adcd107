"""The bridge's method table (contract.md §11): one handler per JSON-RPC method.

Handlers parse their params into typed values once and call into the core
(queues, sessions, turn runner), the router, the gateway manager or mounts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from xwm_bridge import jsonrpc
from xwm_bridge.app.operator import EVENT_METHOD, OPERATOR_METHODS, OperatorMethods
from xwm_bridge.core.context import CallContext, Handler
from xwm_bridge.core.params import SessionParams, session_id_of
from xwm_bridge.core.queues import (
    QueueFullError,
    ShuttingDownError,
    ThreadQueues,
    WithdrawnError,
)
from xwm_bridge.core.replay import ReplayParams, replay
from xwm_bridge.core.sessions import SESSION_FORBIDDEN
from xwm_bridge.jsonrpc import INTERNAL_ERROR, RpcError
from xwm_bridge.mounts.reconcile import MAX_RUNNING_CLIS, MountsRequest, reconcile
from xwm_bridge.observability import context as obs
from xwm_bridge.observability.logging import capped
from xwm_bridge.providers.stdio.permissions import PermissionAnswer
from xwm_bridge.router.dispatch import resolve_dispatch
from xwm_bridge.router.resolver import EMPTY_FIELDS, RoutingRequest
from xwm_bridge.store.cluster import RemoteAnswerError
from xwm_bridge.store.records import Answerer

if TYPE_CHECKING:
    from xwm_bridge.app.bridge import Bridge

#: Backends present in this build; capabilities never advertise the others.
MULTI_AGENT_AVAILABLE = True
GATEWAY_PROVIDERS: list[dict[str, str]] = [
    {"providerId": "local", "label": "Local"},
    {"providerId": "openclaw", "label": "OpenClaw"},
]
SHUTTING_DOWN_MESSAGE = "bridge is shutting down; retry on another replica"


async def _queued(
    queues: ThreadQueues,
    thread_id: str,
    fut: asyncio.Future[Any],
    withdrawn: asyncio.Future[None] | None,
) -> Any:
    """The result of a queued turn; :class:`WithdrawnError` if ``withdrawn`` ends first
    while the turn still waits (it is then off the queue and never runs)."""
    if withdrawn is not None and not fut.done():
        if not withdrawn.done():
            try:
                await asyncio.wait((fut, withdrawn), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                fut.cancel()  # as `await fut` would: the queue skips it
                raise
        if not fut.done() and queues.withdraw(thread_id, fut):
            raise WithdrawnError()
    return await fut


class BridgeMethods:
    """The handlers of ``serve`` and ``acp-stdio``, bound to one :class:`Bridge`."""

    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._config = bridge.config
        self._operator = OperatorMethods(bridge)
        #: discovery commands of all reconciles at once (``reconcile.MAX_RUNNING_CLIS``)
        self._cli_places = asyncio.Semaphore(MAX_RUNNING_CLIS)

    def table(self) -> dict[str, Handler]:
        return {
            "acp.capabilities": self.capabilities,
            "session.start": self.session_turn,
            "session.message": self.session_turn,
            "session.cancel": self.session_cancel,
            "session.close": self.session_close,
            "session.permission": self.session_permission,
            "session.replay": self.session_replay,
            "xworkmate.routing.resolve": self.routing_resolve,
            "xworkmate.dispatch.resolve": self.dispatch_resolve,
            "xworkmate.mounts.reconcile": self.mounts_reconcile,
            "xworkmate.gateway.connect": self.gateway_connect,
            "xworkmate.gateway.request": self.gateway_request,
            "xworkmate.gateway.disconnect": self.gateway_disconnect,
            **self._operator.table(),
        }

    # --- capabilities ---------------------------------------------------------------------

    async def capabilities(
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
            "localAgents": self._local_agents(),
            "capabilities": {
                "single_agent": single,
                "multi_agent": multi,
                "providerCatalog": catalog,
                "gatewayProviders": gateways,
            },
            # issue 13: the operator methods and the live feed's notification
            "operator": {"methods": list(OPERATOR_METHODS), "watchNotification": EVENT_METHOD},
        }

    def _local_agents(self) -> list[dict[str, Any]]:
        """Each known or configured stdio agent: found or not (and why), and what it
        told the bridge about itself (models, modes, auth methods) once it ran."""
        executor = self._bridge.stdio_agents
        out = []
        for status in self._bridge.agents.agents:
            item = status.wire()
            if status.found and executor.handles(status.id):
                item["providerId"] = status.id
                item.update(executor.catalog.wire(status.id))
            out.append(item)
        return out

    # --- session turns ----------------------------------------------------------------------

    async def session_turn(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        bridge = self._bridge
        sp = SessionParams.parse(params)
        if bridge.supervisor.closing:
            raise RpcError(jsonrpc.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE)
        queues, sessions = bridge.queues, bridge.sessions
        # refuse another principal's live session at once; one only in the store is
        # checked at the head of the queue (core/turns.py), before any effect
        sessions.check_live_owner(sp.session_id, call.principal)
        try:
            # refuse an overflowing turn before it has any effect (no session.start reset)
            queues.check_capacity(sp.thread_id)
        except QueueFullError as exc:
            raise RpcError(jsonrpc.QUEUE_FULL, str(exc)) from None
        # a session.start resets the session when its turn runs, at the head of the
        # queue (core/turns.py): turns queued before it still continue the old one
        sessions.turn_queued(sp.session_id)
        request_id = obs.request_id.get()
        runner = bridge.runner

        def job() -> Awaitable[dict[str, Any]]:
            return runner.run(
                method,
                sp,
                call.notify,
                call.principal,
                request_id=request_id,
                client=call.client,
                notify_many=call.notify_many,
                connection=call.connection,
            )

        try:
            if bridge.cluster is None:
                fut = queues.submit_nowait(sp.thread_id, job)
                result: dict[str, Any] = await _queued(queues, sp.thread_id, fut, call.withdrawn)
            else:
                result = await self._clustered(sp, job, call.withdrawn)
        except QueueFullError as exc:
            raise RpcError(jsonrpc.QUEUE_FULL, str(exc)) from None
        except ShuttingDownError:
            raise RpcError(jsonrpc.SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE) from None
        finally:
            sessions.turn_dequeued(sp.session_id)
        return result

    async def _clustered(
        self,
        sp: SessionParams,
        job: Callable[[], Awaitable[dict[str, Any]]],
        withdrawn: asyncio.Future[None] | None,
    ) -> dict[str, Any]:
        """Several replicas: a place in the thread's Redis queue, then the local queue."""
        cluster = self._bridge.cluster
        assert cluster is not None
        # Redis order and local order of a thread never disagree
        async with cluster.ordering(sp.thread_id):
            ticket = await cluster.enqueue(sp.thread_id, sp.session_id)
            try:
                fut = self._bridge.queues.submit_nowait(sp.thread_id, cluster.wrap(ticket, job))
            except BaseException:
                await asyncio.shield(cluster.release(ticket))
                raise
        try:  # waiting for another replica's lease, it has left the local queue: a
            # withdrawal then applies when the turn starts (its cancel), as on one replica
            result: dict[str, Any] = await _queued(
                self._bridge.queues, sp.thread_id, fut, withdrawn
            )
            return result
        finally:
            if not ticket.started:  # refused, skipped or abandoned before it ran
                await asyncio.shield(cluster.release(ticket))

    async def session_cancel(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = session_id_of(params)
        await self._bridge.sessions.check_owner(session_id, call.principal)
        cancelled = self._bridge.sessions.cancel(session_id)
        cluster = self._bridge.cluster
        if not cancelled and cluster is not None:
            cancelled = await cluster.cancel_remote(session_id)  # running elsewhere
        return {"accepted": True, "cancelled": cancelled}

    async def session_close(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = session_id_of(params)
        await self._bridge.sessions.check_owner(session_id, call.principal)
        closed = await self._bridge.sessions.close_any(session_id)  # live or stored
        cluster = self._bridge.cluster
        if cluster is not None:  # other replicas hold copies, one may run its turn
            closed = await cluster.close_remote(session_id) or closed
        return {"accepted": True, "closed": closed}

    async def session_permission(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """The client's answer to a ``permission`` update of a stdio agent, from any
        transport (the first valid answer wins; the record says who gave it)."""
        answer = PermissionAnswer.parse(params)
        sessions = self._bridge.sessions
        await sessions.check_owner(answer.session_id, call.principal)
        by = Answerer(call.transport, call.peer, call.principal)
        broker = self._bridge.permissions
        if self._bridge.cluster is not None and not broker.knows(
            answer.session_id, answer.request_id
        ):
            forwarded = await self._answer_elsewhere(answer, by)
            if forwarded is not None:
                return forwarded
        # the request's own principal too: its session may already be gone (closed, its
        # turn not yet cancelled), and an unknown session is anyone's
        return broker.answer(answer, by, lambda owner: sessions.may_use(owner, call.principal))

    async def _answer_elsewhere(
        self, answer: PermissionAnswer, by: Answerer
    ) -> dict[str, Any] | None:
        """A request another replica raised (its stored record names it): forwarded
        there and answered as if its own client had. None: no live replica holds it."""
        cluster = self._bridge.cluster
        assert cluster is not None
        key = (answer.session_id, answer.request_id)
        stored = next((p for p in await self._bridge.store.permissions() if p.key == key), None)
        if stored is None or not stored.owner:
            return None
        if not self._bridge.sessions.may_use(stored.principal, by.principal):
            raise RpcError(jsonrpc.FORBIDDEN, SESSION_FORBIDDEN)
        payload = {
            "sessionId": answer.session_id,
            "requestId": answer.request_id,
            "optionId": answer.option_id,
            "by": {"transport": by.transport, "address": by.address, "principal": by.principal},
        }
        try:
            return await cluster.answer_remote(stored.owner, payload)
        except RemoteAnswerError as exc:
            raise RpcError(exc.code, exc.message) from None
        except TimeoutError as exc:  # the owner did not reply in time (Redis away is
            # StoreUnavailable: "session store unavailable", as for every other request)
            raise RpcError(
                INTERNAL_ERROR,
                capped(
                    f"permission request {answer.request_id} is held by replica "
                    f"{stored.owner}, which did not answer: {type(exc).__name__}: {exc}",
                    500,
                ),
            ) from None

    async def session_replay(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """Catch-up after a disconnect: the ledger after ``afterSeq``."""
        rp = ReplayParams.parse(params, self._config.store.replay_max_items)
        await self._bridge.sessions.check_owner(rp.session_id, call.principal)
        return await replay(self._bridge.sessions, rp)

    # --- routing, dispatch, mounts -----------------------------------------------------------

    async def routing_resolve(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        """contract.md §11.5: a preflight; no session, no queue, no memory write."""
        req = RoutingRequest.parse(params)
        if req is None:
            return {"ok": True, **EMPTY_FIELDS}
        decision = await self._bridge.router.resolve(req)
        return {"ok": True, **decision.fields()}

    async def dispatch_resolve(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return resolve_dispatch(params)

    async def mounts_reconcile(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        request = MountsRequest.parse(params)
        return await reconcile(request, self._config.mounts, self._cli_places)

    # --- gateway runtimes ---------------------------------------------------------------------

    async def gateway_connect(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._bridge.gateway.connect(
            params, call.principal, call.notify, call.connection, call.bearer
        )

    async def gateway_request(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._bridge.gateway.request(
            params, call.principal, call.notify, call.connection
        )

    async def gateway_disconnect(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        return await self._bridge.gateway.disconnect(
            params, call.principal, call.notify, call.connection
        )


def session_methods(methods: BridgeMethods) -> dict[str, Handler]:
    """The ``session.*`` part of the table (other front ends build on it)."""
    return {k: v for k, v in methods.table().items() if k.startswith("session.")}
