"""One running prompt's handlers: the agent's ``session/update`` notifications and
its requests (``session/request_permission``, ``fs/*``, ``terminal/*``).

Requests go to :attr:`TurnState.request_hook` first when one is set (a front end
that relays them to its own client), then to the bridge's own handlers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.usage import TurnUsage
from xwm_bridge.providers.stdio import client_fs, codec, mapping
from xwm_bridge.providers.stdio.acp_sessions import AcpSessionRef
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.options import SessionOptions
from xwm_bridge.providers.stdio.permissions import PermissionBroker, outcome_label
from xwm_bridge.providers.stdio.policy import ALLOW, ASK, PolicyStore
from xwm_bridge.providers.stdio.terminal import Terminals

ASK_NEEDS_STREAM = (
    "permission rule says ask, but this transport cannot carry notifications "
    "(use SSE, WebSocket or stdio); rejected"
)


class TurnServices(Protocol):
    """What a turn's handlers use from the executor."""

    config: BridgeConfig
    broker: PermissionBroker
    policy: PolicyStore
    terminals: Terminals


#: An extra handler for agent requests (e.g. relaying ``fs/*`` to an ACP client):
#: returns the answer, or :data:`NOT_HANDLED` to fall through to the bridge's own.
RequestHook = Callable[[str, dict[str, Any]], Awaitable[Any]]
NOT_HANDLED = object()


@dataclass(slots=True)
class TurnState:
    """Handlers for one running prompt: updates, permission and fs requests."""

    ctx: TurnContext
    cwd: str
    owner: TurnServices
    ref: AcpSessionRef | None = None
    transcript: mapping.TurnTranscript = field(default_factory=mapping.TurnTranscript)
    usage: TurnUsage = field(default_factory=TurnUsage)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    #: tried first for every agent request (see :data:`RequestHook`)
    request_hook: RequestHook | None = None

    async def on_update(self, update: dict[str, Any]) -> None:
        self.transcript.observe(update)
        kind = update.get("sessionUpdate")
        if kind == "usage_update":
            self.usage.observe_update(update)
        elif kind in ("config_option_update", "current_mode_update") and self.ref is not None:
            self.ref.options = SessionOptions.of(update, self.ref.options)
            if kind == "current_mode_update":
                mode = coerce.text(update.get("currentModeId"))
                self.ref.options = self.ref.options.with_current(mode=mode)
        payload = mapping.map_update(update)
        if payload is not None:
            await self.ctx.emit(payload)

    async def on_request(self, method: str, params: dict[str, Any]) -> Any:
        if self.request_hook is not None:
            answer = await self.request_hook(method, params)
            if answer is not NOT_HANDLED:
                return answer
        agents = self.owner.config.agents
        if method == "session/request_permission":
            return await self.permission(params)
        if method.startswith("fs/") and agents.fs_enabled:
            root = client_fs.confined_root(self.cwd, self.owner.config.allowed_roots)
            if method == "fs/read_text_file":
                return await client_fs.read_text_file(params, root, agents.fs_max_file_bytes)
            if method == "fs/write_text_file":
                return await client_fs.write_text_file(params, root, agents.fs_max_file_bytes)
        if method.startswith("terminal/") and agents.terminal_enabled:
            root = client_fs.confined_root(self.cwd, self.owner.config.allowed_roots)
            return await self.owner.terminals.handle(method, params, root)
        raise ClientError(codec.METHOD_NOT_FOUND, f"method not supported by this client: {method}")

    async def permission(self, params: dict[str, Any]) -> dict[str, Any]:
        tool_call = params.get("toolCall")
        tool_call = tool_call if isinstance(tool_call, dict) else {}
        options = params.get("options")
        decision = self.owner.policy.decide(tool_call, self.cwd)
        reason = decision.reason
        record: dict[str, Any] = {
            "toolCallId": coerce.text(tool_call.get("toolCallId")),
            "title": coerce.text(tool_call.get("title")),
            "kind": coerce.text(tool_call.get("kind"), "other"),
            "decision": decision.action,
        }
        outcome: dict[str, Any]
        if decision.action == ASK and self.ctx.notify is None:
            reason = ASK_NEEDS_STREAM
            outcome = self._policy_outcome(options, allow=False)
        elif decision.action == ASK:
            outcome, reason = await self._ask(params, options)
        else:
            outcome = self._policy_outcome(options, allow=decision.action == ALLOW)
            if decision.action == ALLOW and mapping.choose_option(options, True) is None:
                reason = "no allow_once option offered (allow_always is never chosen); rejected"
        record["outcome"] = outcome_label(outcome, options)
        record["reason"] = reason
        self.permissions.append(record)
        if decision.action != ASK or self.ctx.notify is None:
            await self.ctx.emit(
                {
                    "type": "permission",
                    "toolCall": tool_call,
                    "decision": decision.action,
                    "outcome": record["outcome"],
                    "reason": reason,
                    "pending": False,
                    "error": False,
                }
            )
        return outcome

    @staticmethod
    def _policy_outcome(options: Any, *, allow: bool) -> dict[str, Any]:
        oid = mapping.choose_option(options, allow)
        if oid is None and allow:
            oid = mapping.choose_option(options, False)
        return mapping.selected(oid) if oid else dict(mapping.CANCELLED_OUTCOME)

    async def _ask(self, params: dict[str, Any], options: Any) -> tuple[dict[str, Any], str]:
        broker = self.owner.broker
        timeout = self.owner.config.agents.permission_timeout
        entry = broker.open(self.ctx.session_id, options)
        try:
            await self.ctx.emit(mapping.permission_payload(entry.request_id, params))
            try:
                outcome = await asyncio.wait_for(asyncio.shield(entry.future), timeout)
            except TimeoutError:
                return (
                    self._policy_outcome(options, allow=False),
                    f"no answer from the client within {timeout:g}s; rejected",
                )
            label = outcome_label(outcome, options)
            return outcome, f"client answered {label}" if label != "cancelled" else "turn cancelled"
        finally:
            broker.discard(entry)
