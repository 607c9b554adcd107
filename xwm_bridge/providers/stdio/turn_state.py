"""One running prompt's handlers: the agent's ``session/update`` notifications and
its requests (``session/request_permission``, ``fs/*``, ``terminal/*``).

Requests the calling client serves (``TurnContext.client``: an ACP front door that
relays ``fs/*`` and ``terminal/*`` to its editor) go there; the rest to the bridge's
own handlers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.usage import TurnUsage
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.providers.single_agent import provider_id_of
from xwm_bridge.providers.stdio import client_fs, codec, mapping
from xwm_bridge.providers.stdio.acp_sessions import AcpSessionRef
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.options import SessionOptions
from xwm_bridge.providers.stdio.permissions import (
    EXPIRED,
    POLICY,
    SELECTED,
    PermissionBroker,
    outcome_label,
)
from xwm_bridge.providers.stdio.policy import ALLOW, ASK, PolicyStore
from xwm_bridge.providers.stdio.terminal import Terminals
from xwm_bridge.store.records import Answerer, PermissionRecord
from xwm_bridge.tasks import wait_for


class TurnServices(Protocol):
    """What a turn's handlers use from the executor."""

    config: BridgeConfig
    broker: PermissionBroker
    policy: PolicyStore
    terminals: Terminals


@dataclass(slots=True)
class TurnState:
    """Handlers for one running prompt: updates, permission and fs requests."""

    ctx: TurnContext
    cwd: str
    owner: TurnServices
    ref: AcpSessionRef | None = None
    #: the agent's environment (``AgentSpec.env``): what its terminals start from
    agent_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: the agent the turn runs on: its terminals are released when its process exits
    agent: object = field(default=None, repr=False)
    transcript: mapping.TurnTranscript = field(default_factory=mapping.TurnTranscript)
    usage: TurnUsage = field(default_factory=TurnUsage)
    permissions: list[dict[str, Any]] = field(default_factory=list)

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
        agents = self.owner.config.agents
        if method == "session/request_permission":
            return await self.permission(params)
        client = self.ctx.client
        if client is not None and client.serves(method):  # the editor owns files/terminals
            try:
                return await client.request(method, params)
            except RpcError as exc:
                raise ClientError(exc.code, exc.message) from None
        if method.startswith("fs/") and agents.fs_enabled:
            root = client_fs.confined_root(self.cwd, self.owner.config.allowed_roots)
            if method == "fs/read_text_file":
                return await client_fs.read_text_file(params, root, agents.fs_max_file_bytes)
            if method == "fs/write_text_file":
                return await client_fs.write_text_file(params, root, agents.fs_max_file_bytes)
        if method.startswith("terminal/") and agents.terminal_enabled:
            root = client_fs.confined_root(self.cwd, self.owner.config.allowed_roots)
            return await self.owner.terminals.handle(
                method, params, root, self.agent_env, self.agent
            )
        raise ClientError(codec.METHOD_NOT_FOUND, f"method not supported by this client: {method}")

    async def permission(self, params: dict[str, Any]) -> dict[str, Any]:
        tool_call = params.get("toolCall")
        tool_call = tool_call if isinstance(tool_call, dict) else {}
        options = params.get("options")
        streamless = self.ctx.notify is None
        decision = await self.owner.policy.decide(tool_call, self.cwd, streamless)
        reason = decision.reason
        record: dict[str, Any] = {
            "toolCallId": coerce.text(tool_call.get("toolCallId")),
            "title": coerce.text(tool_call.get("title")),
            "kind": coerce.text(tool_call.get("kind"), "other"),
            "decision": decision.action,
        }
        outcome: dict[str, Any]
        answered: PermissionRecord | None = None
        withdrawn = False
        if decision.action == ASK:
            # every watcher (console, `client watch`) sees it, whatever carries the turn
            outcome, reason, answered, withdrawn = await self._ask(params, options, tool_call)
        else:
            outcome = self._policy_outcome(options, allow=decision.action == ALLOW)
            if decision.action == ALLOW and mapping.choose_option(options, True) is None:
                reason = "no allow_once option offered (allow_always is never chosen); rejected"
        record["outcome"] = outcome_label(outcome, options)
        record["reason"] = reason
        if answered is not None:
            record["requestId"] = answered.request_id
            if answered.by is not None:
                record["answeredBy"] = answered.by.wire()
        else:
            self._decided(tool_call, options, outcome, record["outcome"], reason, decision.action)
        self.permissions.append(record)
        update: dict[str, Any] = {
            "type": "permission",
            "toolCall": tool_call,
            "decision": decision.action,
            "outcome": record["outcome"],
            "reason": reason,
            "pending": False,
            "error": False,
        }
        if answered is not None:  # the pending update's resolution, on the turn's stream
            update["requestId"] = answered.request_id
            update["resolution"] = answered.resolution
            update["answeredBy"] = answered.by.wire() if answered.by is not None else None
        await self.ctx.emit(update)
        if withdrawn:  # the cancel it took to say so
            raise asyncio.CancelledError
        return outcome

    def _decided(
        self,
        tool_call: dict[str, Any],
        options: Any,
        outcome: dict[str, Any],
        label: str,
        reason: str,
        action: str,
    ) -> None:
        """A policy allow/reject: audited and shown to watchers, never pending."""
        inner = outcome.get("outcome")
        oid = inner.get("optionId") if isinstance(inner, dict) else None
        now = time.time()
        self.owner.broker.decided(
            PermissionRecord(
                self.ctx.session_id,
                f"policy-{self.ctx.turn_id}-{len(self.permissions) + 1}",
                turn_id=self.ctx.turn_id,
                provider=provider_id_of(self.ctx),
                tool_call=tool_call,
                options=tuple(o for o in options if isinstance(o, dict))
                if isinstance(options, list)
                else (),
                created_at=now,
                state="resolved",
                resolution=POLICY,
                option_id=oid if isinstance(oid, str) else "",
                outcome=label,
                reason=reason,
                by=Answerer("policy", ""),
                resolved_at=now,
                principal=self.ctx.principal,
            ),
            action,
        )

    @staticmethod
    def _policy_outcome(options: Any, *, allow: bool) -> dict[str, Any]:
        oid = mapping.choose_option(options, allow)
        if oid is None and allow:
            oid = mapping.choose_option(options, False)
        return mapping.selected(oid) if oid else dict(mapping.CANCELLED_OUTCOME)

    async def _ask(
        self, params: dict[str, Any], options: Any, tool_call: dict[str, Any]
    ) -> tuple[dict[str, Any], str, PermissionRecord, bool]:
        """The request's outcome, why, its record, and whether it was withdrawn as its
        handler was cancelled (the agent exited: ``AcpAgent._withdraw`` resolves the
        session's requests, then cancels its requests being served); the caller then
        still sends the resolution on the turn's stream, and re-raises the cancel."""
        broker = self.owner.broker
        timeout = self.owner.config.agents.permission_timeout
        entry = broker.open(
            self.ctx.session_id,
            options,
            turn_id=self.ctx.turn_id,
            provider=provider_id_of(self.ctx),
            tool_call=tool_call,
            timeout=timeout,
            principal=self.ctx.principal,
        )
        try:
            await self.ctx.emit(mapping.permission_payload(entry.request_id, params))
            withdrawn = False
            try:
                outcome = await wait_for(asyncio.shield(entry.future), timeout)
            except TimeoutError:
                reason = f"no answer within {timeout:g}s; rejected"
                broker.resolve(entry, EXPIRED, reason, self._policy_outcome(options, allow=False))
                outcome = entry.future.result()
                return outcome, reason, entry.record, False
            except asyncio.CancelledError:
                if not entry.future.done():
                    raise
                outcome, withdrawn = entry.future.result(), True
            label = outcome_label(outcome, options)
            if entry.record.resolution == SELECTED:
                by = entry.record.by
                where = f" over {by.transport} from {by.address}" if by and by.address else ""
                return outcome, f"client answered {label}{where}", entry.record, withdrawn
            return outcome, entry.record.reason or "turn cancelled", entry.record, withdrawn
        finally:
            broker.discard(entry)
