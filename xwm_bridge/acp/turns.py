"""One ACP prompt as one bridge turn: the turn's notify callback and client hook.

:class:`TurnRelay` is handed to :meth:`BridgeMethods.session_turn` as the turn's
``notify`` (every bridge notification becomes the ACP ``session/update`` it means,
sent to whichever client the session is attached to *now*) and as its
:class:`~xwm_bridge.core.context.ClientRequests` (a stdio agent's ``fs/*`` and
``terminal/*`` go to the editor when it declared them). A pending ``permission``
update is relayed as ``session/request_permission``; the client's choice goes back
through the :class:`~xwm_bridge.providers.stdio.permissions.PermissionBroker`, so
``agents.permission_rules`` still answer ``allow``/``reject`` without asking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from asyncio import FIRST_COMPLETED
from typing import TYPE_CHECKING, Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.acp import codec, prompts, updates
from xwm_bridge.acp.sessions import AcpSession
from xwm_bridge.app.dispatcher import report_turn
from xwm_bridge.core.queues import ShuttingDownError, WithdrawnError
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.providers.stdio.permissions import PermissionAnswer
from xwm_bridge.store.base import StoreUnavailable

if TYPE_CHECKING:
    from xwm_bridge.acp.front import AcpFrontDoor

log = logging.getLogger("xwm_bridge.acp")

#: a prompt stored with the turn in the ledger is cut to its text past this size
LEDGER_PROMPT_MAX = 256 * 1024
NOT_CONNECTED = "the ACP client is not connected"
#: how a turn may end after a cancel without being a bug (logged without a traceback)
EXPECTED_AFTER_CANCEL = (RpcError, StoreUnavailable, ShuttingDownError, TimeoutError)


def _update(session_id: str, update: dict[str, Any]) -> dict[str, Any]:
    return jsonrpc.notification("session/update", {"sessionId": session_id, "update": update})


class TurnRelay:
    def __init__(
        self, front: AcpFrontDoor, session: AcpSession, blocks: list[dict[str, Any]]
    ) -> None:
        self.front = front
        self.session = session
        self.blocks = blocks
        client = session.client
        self.state = updates.TurnMapState(
            terminals=client is not None and client.serves("terminal/create")
        )
        self.turn_id = ""
        self.cancel_requested = False
        self._cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._permissions: set[asyncio.Task[None]] = set()
        #: resolved when a client attaches to the session (``session/load``, ``resume``)
        self._attach: asyncio.Future[None] | None = None

    # --- the turn's notify ----------------------------------------------------------------

    async def __call__(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        bridge_update = "threadId" in params and "seq" in params
        if bridge_update and not self.turn_id:
            self._started(coerce.text(params.get("turnId")))
        if bridge_update and params.get("type") == "permission" and params.get("pending"):
            self._relay_permission(params)
            return
        pos = self._pos(params, bridge_update)
        sid = self.session.session_id
        for update in updates.acp_updates(message, self.state):
            await self.session.deliver(_update(sid, update), pos)

    def _pos(self, params: dict[str, Any], bridge_update: bool) -> int | None:
        """The event id of a live message: the ledger numbered it just before this notify
        (``session/load`` skips what its replay already held)."""
        live = self.front.bridge.sessions.get(self.session.session_id)
        return live.events if live is not None else None

    def _started(self, turn_id: str) -> None:
        self.turn_id = turn_id
        # the prompt goes into the turn's ledger, for session/load after a restart
        blocks: list[dict[str, Any]] = self.blocks
        if len(jsonrpc.dumps(blocks)) > LEDGER_PROMPT_MAX:
            blocks = [{"type": "text", "text": prompts.prompt_text(blocks)[:LEDGER_PROMPT_MAX]}]
        self._record(updates.USER_MESSAGE, {"prompt": blocks})
        if self.cancel_requested:  # a cancel that came before the turn had started
            self.front.cancel_turn(self.session.session_id)

    def _record(self, method: str, params: dict[str, Any]) -> int | None:
        """Write one frame of the front door's own into the turn's ledger; its event id
        (None when nothing was written)."""
        registry = self.front.bridge.sessions
        live = registry.get(self.session.session_id)
        if live is None or not self.turn_id:
            return None
        message = jsonrpc.notification(
            method, {"sessionId": self.session.session_id, "turnId": self.turn_id, **params}
        )
        before = live.events
        registry.record(live, self.turn_id, [message], True)
        return live.events if live.events > before else None

    # --- permission requests --------------------------------------------------------------

    def _relay_permission(self, payload: dict[str, Any]) -> None:
        task = self.front.tasks.spawn(
            self._permission(payload), name=f"acp-permission:{self.session.session_id}"
        )
        self._permissions.add(task)
        task.add_done_callback(self._permissions.discard)

    def attached(self) -> None:
        """A client attached to the session: permission requests still open ask it."""
        if self._attach is not None and not self._attach.done():
            self._attach.set_result(None)

    def _next_attach(self) -> asyncio.Future[None]:
        if self._attach is None or self._attach.done():
            self._attach = asyncio.get_running_loop().create_future()
        return self._attach

    def _open(self, request_id: str) -> bool:
        entry = self.front.bridge.permissions.pending.get((self.session.session_id, request_id))
        return entry is not None and not entry.future.done()

    def _settled(self, request_id: str) -> asyncio.Future[Any]:
        """Done once the broker has answered the agent (whoever answered)."""
        entry = self.front.bridge.permissions.pending.get((self.session.session_id, request_id))
        if entry is not None:
            return entry.future
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def _permission(self, payload: dict[str, Any]) -> None:
        """Ask the attached client; while the request is open (the broker has not
        resolved it: no answer, deadline, rule or console), ask again whichever
        client attaches next, after a drop or a ``session/load`` elsewhere."""
        request_id = coerce.text(payload.get("requestId"))
        if not request_id:
            return
        params = updates.permission_request(self.session.session_id, payload)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.front.config.agents.permission_timeout
        asked = False
        settled = self._settled(request_id)
        while not asked or self._open(request_id):
            attach = self._next_attach()
            client = self.front.connection_of(self.session)
            remaining = deadline - loop.time()
            if remaining <= 0 or self._cancelled.done():
                return
            if client is None:  # nobody to ask now: wait for a client to attach
                asked = True
                await asyncio.wait(
                    {attach, self._cancelled, settled},
                    timeout=remaining,
                    return_when=FIRST_COMPLETED,
                )
                if not attach.done():
                    return  # cancelled, or the deadline (the broker rejects it)
                continue
            asked = True
            if self.session.attaching.locked():  # a session/load replays the history:
                # the question goes after it (else it overtakes the replayed tool_call it
                # is about, and the load's answer), then to whoever holds the session
                await self._after_replay(remaining, settled)
                continue
            fut = await client.start_request(
                "session/request_permission", params, self.session.session_id
            )
            try:
                while True:  # a reattach of the same connection does not ask it twice
                    done, _ = await asyncio.wait(
                        {fut, self._cancelled, attach, settled},
                        timeout=max(0.0, deadline - loop.time()),
                        return_when=FIRST_COMPLETED,
                    )
                    if fut in done or not attach.done() or settled.done():
                        break
                    if self.front.connection_of(self.session) is not client:
                        break
                    attach = self._next_attach()
            except asyncio.CancelledError:  # the turn ended (finish)
                await client.withdraw(fut, self.session.session_id)
                raise
            if fut not in done:
                if attach.done() and not settled.done() and not self._cancelled.done():
                    client.forget(fut)
                    continue  # another connection took the session: ask it
                # settled by the bridge (turn cancel, deadline, console, rule): the
                # client's dialog is withdrawn, its late answer dropped
                await client.withdraw(fut, self.session.session_id)
                return
            try:
                answer = fut.result()
            except RpcError as exc:
                if client.closed:
                    continue  # the connection dropped: ask the next client that attaches
                log.info("permission request failed", extra={"error": exc.message})
                answer = None
            option = updates.chosen_option(answer, params["options"])
            if option is None:  # cancelled with no reject option, not offered, an error:
                # the agent is told "cancelled" now, not at agents.permission_timeout
                self.front.bridge.permissions.decline(
                    self.session.session_id, request_id, "the ACP client chose no option"
                )
                return
            with contextlib.suppress(RpcError):  # answered meanwhile (deadline, cancel, elsewhere)
                self.front.bridge.permissions.answer(
                    PermissionAnswer(self.session.session_id, request_id, option)
                )
            return

    async def _after_replay(self, within: float, settled: asyncio.Future[Any]) -> None:
        """Wait until no ``session/load`` holds the session's attach lock (its replay and
        flush are over), the turn is cancelled, the question settled, or ``within`` s."""
        lock = self.session.attaching
        waiter: asyncio.Task[bool] | None = None
        try:
            async with asyncio.TaskGroup() as tg:  # the waiter ends here, whatever happens
                waiter = tg.create_task(lock.acquire())
                ends: set[asyncio.Future[Any]] = {waiter, self._cancelled, settled}
                await asyncio.wait(ends, timeout=within, return_when=FIRST_COMPLETED)
                waiter.cancel()  # a no-op once it has the lock
        finally:
            if waiter is not None and waiter.done() and not waiter.cancelled():
                lock.release()  # only waited for it: the next load takes it

    # --- ClientRequests: the agent's fs/* and terminal/* ----------------------------------

    def serves(self, method: str) -> bool:
        client = self.session.client
        return client is not None and client.serves(method)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        client = self.front.connection_of(self.session)
        if client is None:
            raise RpcError(jsonrpc.INTERNAL_ERROR, NOT_CONNECTED)
        agents = self.front.config.agents
        timeout = (
            agents.prompt_timeout if method == "terminal/wait_for_exit" else agents.session_timeout
        )
        out = {**params, "sessionId": self.session.session_id}
        fut = await client.start_request(method, out, self.session.session_id)
        try:
            done, _ = await asyncio.wait(
                {fut, self._cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:  # answered: a no-op; else dropped, also when this task is cancelled
            client.forget(fut)
        if fut in done:
            return fut.result()
        if self._cancelled.done():
            raise RpcError(codec.REQUEST_CANCELLED, "request cancelled: the turn was cancelled")
        raise RpcError(
            jsonrpc.INTERNAL_ERROR, f"the ACP client did not answer {method} within {timeout:g}s"
        )

    # --- end of the turn ---------------------------------------------------------------

    @property
    def cancelled(self) -> asyncio.Future[None]:
        """Done once the prompt is cancelled (:meth:`cancel`)."""
        return self._cancelled

    def cancel(self) -> None:
        """``session/cancel``: pending client requests end as cancelled."""
        self.cancel_requested = True
        if not self._cancelled.done():
            self._cancelled.set_result(None)

    def finish(self) -> None:
        for task in list(self._permissions):
            task.cancel()

    async def respond(self, result: dict[str, Any]) -> dict[str, Any]:
        """The ``session/prompt`` result of the turn's bridge result."""
        stop = updates.stop_reason(result, self.cancel_requested)
        # the request's audit line and metric: as for the turn on the HTTP path
        report_turn(
            "failed" if stop is None else "cancelled" if stop == "cancelled" else "ok", result
        )
        if stop is None:
            raise RpcError(
                jsonrpc.INTERNAL_ERROR,
                f"turn failed: {coerce.text(result.get('error'), 'unknown error')}",
            )
        text = updates.final_output(result)
        if text and not self.state.message_chars and stop != "cancelled":
            # a provider that streamed nothing: its final output is the message
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }
            # in the ledger first, then sent with its position, as every update: a
            # session/load whose ledger read has it skips it in its buffer (else the
            # loading client got it twice, replayed and then flushed)
            pos = self._record(updates.AGENT_MESSAGE, {"text": text})
            await self.session.deliver(_update(self.session.session_id, update), pos)
        return {"stopReason": stop}

    def respond_error(self, error: Exception) -> dict[str, Any]:
        """The answer of a prompt whose turn raised ``error`` (a routing or gateway error, a
        store outage, the shutdown): once the client sent ``session/cancel``, ACP has the
        agent answer ``cancelled`` whatever ended the turn; before that, the error."""
        if not self.cancel_requested:
            raise error
        if isinstance(error, WithdrawnError):  # cancelled while queued: it never ran
            report_turn("cancelled", {})
            return {"stopReason": "cancelled"}
        fields = {"error": coerce.text(str(error))[:500], "kind": type(error).__name__}
        if isinstance(error, EXPECTED_AFTER_CANCEL):
            log.info("ACP prompt cancelled; its turn then failed", extra=fields)
        else:  # a bug: the answer is still "cancelled", but its traceback is wanted
            log.error("ACP prompt cancelled; its turn then failed", extra=fields, exc_info=error)
        report_turn("cancelled", {})
        return {"stopReason": "cancelled"}
