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
from typing import TYPE_CHECKING, Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.acp import codec, mapping
from xwm_bridge.acp.sessions import AcpSession
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.providers.stdio.permissions import PermissionAnswer

if TYPE_CHECKING:
    from xwm_bridge.acp.front import AcpFrontDoor

log = logging.getLogger("xwm_bridge.acp")

#: a prompt stored with the turn in the ledger is cut to its text past this size
LEDGER_PROMPT_MAX = 256 * 1024
NOT_CONNECTED = "the ACP client is not connected"


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
        self.state = mapping.TurnMapState(
            terminals=client is not None and client.serves("terminal/create")
        )
        self.turn_id = ""
        self.cancel_requested = False
        self._cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._permissions: set[asyncio.Task[None]] = set()

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
        for update in mapping.acp_updates(message, self.state):
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
            blocks = [{"type": "text", "text": mapping.prompt_text(blocks)[:LEDGER_PROMPT_MAX]}]
        self._record(mapping.USER_MESSAGE, {"prompt": blocks})
        if self.cancel_requested:  # a cancel that came before the turn had started
            self.front.cancel_turn(self.session.session_id)

    def _record(self, method: str, params: dict[str, Any]) -> None:
        registry = self.front.bridge.sessions
        live = registry.get(self.session.session_id)
        if live is not None and self.turn_id:
            message = jsonrpc.notification(
                method, {"sessionId": self.session.session_id, "turnId": self.turn_id, **params}
            )
            registry.record(live, self.turn_id, [message], True)

    # --- permission requests --------------------------------------------------------------

    def _relay_permission(self, payload: dict[str, Any]) -> None:
        task = self.front.tasks.spawn(
            self._permission(payload), name=f"acp-permission:{self.session.session_id}"
        )
        self._permissions.add(task)
        task.add_done_callback(self._permissions.discard)

    async def _permission(self, payload: dict[str, Any]) -> None:
        request_id = coerce.text(payload.get("requestId"))
        client = self.front.connection_of(self.session)
        if not request_id or client is None:
            return  # nobody to ask: the broker's deadline rejects it
        params = mapping.permission_request(self.session.session_id, payload)
        fut = await client.start_request(
            "session/request_permission", params, self.session.session_id
        )
        timeout = self.front.config.agents.permission_timeout
        done, _ = await asyncio.wait(
            {fut, self._cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if fut not in done:
            client.forget(fut)
            return
        try:
            answer = fut.result()
        except RpcError as exc:
            log.info("permission request failed", extra={"error": exc.message})
            return
        option = mapping.chosen_option(answer, params["options"])
        if option is None:
            return
        with contextlib.suppress(RpcError):  # answered meanwhile (deadline, cancel, elsewhere)
            self.front.bridge.permissions.answer(
                PermissionAnswer(self.session.session_id, request_id, option)
            )

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
        done, _ = await asyncio.wait(
            {fut, self._cancelled}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if fut in done:
            return fut.result()
        client.forget(fut)
        if self._cancelled.done():
            raise RpcError(codec.REQUEST_CANCELLED, "request cancelled: the turn was cancelled")
        raise RpcError(
            jsonrpc.INTERNAL_ERROR, f"the ACP client did not answer {method} within {timeout:g}s"
        )

    # --- end of the turn ---------------------------------------------------------------

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
        stop = mapping.stop_reason(result, self.cancel_requested)
        if stop is None:
            raise RpcError(
                jsonrpc.INTERNAL_ERROR,
                f"turn failed: {coerce.text(result.get('error'), 'unknown error')}",
            )
        text = mapping.final_output(result)
        if text and not self.state.message_chars and stop != "cancelled":
            # a provider that streamed nothing: its final output is the message
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": text},
            }
            await self.session.deliver(_update(self.session.session_id, update))
            self._record(mapping.AGENT_MESSAGE, {"text": text})
        return {"stopReason": stop}
