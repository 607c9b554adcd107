"""Single-agent turns routed to a local stdio ACP agent (``kind: stdio`` providers).

One ACP session per bridge session: created on first use, reused by
``session.message``, recreated after ``session.start``, after a change of
working directory, and after the agent restarted (via ``session/load`` when the
agent supports it). ``session.cancel`` sends ACP ``session/cancel``, answers
pending permission requests with ``cancelled`` and waits briefly for the
agent's ``stopReason: cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.executors import CANCELLED
from xwm_bridge.core.sessions import Session
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.providers.collector import remote_fields
from xwm_bridge.providers.single_agent import failure_result, provider_id_of
from xwm_bridge.providers.stdio import client_fs, codec, mapping
from xwm_bridge.providers.stdio.agent import (
    AcpAgent,
    AgentError,
    AgentSpec,
    ClientError,
    SessionHandlers,
)
from xwm_bridge.providers.stdio.permissions import (
    AGENT_EXITED,
    EXPIRED,
    POLICY,
    SELECTED,
    PermissionBroker,
    outcome_label,
)
from xwm_bridge.providers.stdio.policy import ALLOW, ASK, PolicyStore
from xwm_bridge.providers.stdio.terminal import Terminals
from xwm_bridge.store.records import Answerer, PermissionRecord

log = logging.getLogger("xwm_bridge.agents")


CANCEL_WAIT = 5.0
MAX_TRACKED_SESSIONS = 4096


@dataclass(slots=True)
class AcpSessionRef:
    session: Session  # identity changes on session.start (registry.reset)
    generation: int
    acp_session_id: str
    cwd: str


def agent_spec(provider: ProviderConfig, config: BridgeConfig) -> AgentSpec:
    env = dict(item.split("=", 1) for item in provider.env)
    agents = config.agents
    return AgentSpec(
        name=provider.id,
        argv=provider.command,
        env=env,
        cwd=provider.cwd,
        capabilities=codec.client_capabilities(
            fs_read=agents.fs_enabled and provider.fs_read,
            fs_write=agents.fs_enabled,
            terminal=agents.terminal_enabled,
        ),
        initialize_timeout=agents.initialize_timeout,
        stop_grace=agents.stop_grace,
    )


@dataclass(slots=True)
class TurnState:
    """Handlers for one running prompt: updates, permission and fs requests."""

    ctx: TurnContext
    cwd: str
    owner: StdioAgentExecutor
    transcript: mapping.TurnTranscript = field(default_factory=mapping.TurnTranscript)
    permissions: list[dict[str, Any]] = field(default_factory=list)

    async def on_update(self, update: dict[str, Any]) -> None:
        self.transcript.observe(update)
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
            return await self.owner.terminals.handle(method, params, root)
        raise ClientError(codec.METHOD_NOT_FOUND, f"method not supported by this client: {method}")

    async def permission(self, params: dict[str, Any]) -> dict[str, Any]:
        tool_call = params.get("toolCall")
        tool_call = tool_call if isinstance(tool_call, dict) else {}
        options = params.get("options")
        streamless = self.ctx.notify is None
        decision = self.owner.policy.decide(tool_call, self.cwd, streamless)
        reason = decision.reason
        record: dict[str, Any] = {
            "toolCallId": coerce.text(tool_call.get("toolCallId")),
            "title": coerce.text(tool_call.get("title")),
            "kind": coerce.text(tool_call.get("kind"), "other"),
            "decision": decision.action,
        }
        outcome: dict[str, Any]
        answered: PermissionRecord | None = None
        if decision.action == ASK:
            # every watcher (console, `client watch`) sees it, whatever carries the turn
            outcome, reason, answered = await self._ask(params, options, tool_call)
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
    ) -> tuple[dict[str, Any], str, PermissionRecord]:
        broker = self.owner.broker
        timeout = self.owner.config.agents.permission_timeout
        entry = broker.open(
            self.ctx.session_id,
            options,
            turn_id=self.ctx.turn_id,
            provider=provider_id_of(self.ctx),
            tool_call=tool_call,
            timeout=timeout,
        )
        try:
            await self.ctx.emit(mapping.permission_payload(entry.request_id, params))
            try:
                outcome = await asyncio.wait_for(asyncio.shield(entry.future), timeout)
            except TimeoutError:
                reason = f"no answer within {timeout:g}s; rejected"
                broker.resolve(entry, EXPIRED, reason, self._policy_outcome(options, allow=False))
                outcome = entry.future.result()
                return outcome, reason, entry.record
            label = outcome_label(outcome, options)
            if entry.record.resolution == SELECTED:
                by = entry.record.by
                where = f" over {by.transport} from {by.address}" if by and by.address else ""
                return outcome, f"client answered {label}{where}", entry.record
            return outcome, entry.record.reason or "turn cancelled", entry.record
        finally:
            broker.discard(entry)


def failure_kind(exc: AgentError) -> str:
    """The ``kind`` of ``xwm_upstream_errors_total`` for a failed agent call."""
    if exc.timed_out:
        return "timeout"
    return "remote_error" if exc.code is not None else "transport"


class StdioAgentExecutor:
    def __init__(
        self, config: BridgeConfig, broker: PermissionBroker, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.broker = broker
        self._metrics = metrics or Metrics()
        self.policy = PolicyStore(
            config.agents.permission_rules, config.agents.permission_rules_file
        )
        self.terminals = Terminals(config.agents)
        self._providers = {p.id.lower(): p for p in config.available_providers if p.is_stdio}
        self._agents: dict[str, AcpAgent] = {}
        self._sessions: OrderedDict[str, AcpSessionRef] = OrderedDict()

    def handles(self, provider_id: str) -> bool:
        return provider_id.lower() in self._providers

    def agent(self, provider_id: str) -> AcpAgent:
        key = provider_id.lower()
        agent = self._agents.get(key)
        if agent is None:
            agent = self._agents[key] = AcpAgent(agent_spec(self._providers[key], self.config))
        return agent

    def status(self) -> list[dict[str, Any]]:
        """Every configured stdio agent: started or not, restarts, last error."""
        out = []
        for key, provider in self._providers.items():
            agent = self._agents.get(key)
            row: dict[str, Any] = {"id": provider.id, "label": provider.label or provider.id}
            if agent is None:
                row.update({"running": False, "starts": 0, "restarts": 0, "lastError": None})
            else:
                row.update(agent.status())
            out.append(row)
        return out

    def _provider_id(self, ctx: TurnContext) -> str:
        return provider_id_of(ctx)

    def failure(self, ctx: TurnContext, message: str) -> dict[str, Any]:
        return failure_result(ctx, message)

    def _cwd(self, ctx: TurnContext, provider: ProviderConfig) -> str:
        wd = ctx.turn.working_directory
        if wd:
            if not os.path.isabs(wd) or not os.path.isdir(wd):
                raise AgentError("workingDirectory must be an existing absolute directory")
            return wd
        return os.path.abspath(provider.cwd or os.getcwd())

    async def _acp_session(self, ctx: TurnContext, agent: AcpAgent, cwd: str) -> str:
        ref = self._sessions.get(ctx.session_id)
        timeout = self.config.agents.session_timeout
        if ref is not None and ref.session is ctx.session and ref.cwd == cwd:
            self._sessions.move_to_end(ctx.session_id)
            if ref.generation == agent.generation:
                return ref.acp_session_id
            if agent.can_load_session:  # agent restarted: resume its own history
                with contextlib.suppress(AgentError):
                    await agent.call(
                        "session/load",
                        {"sessionId": ref.acp_session_id, "cwd": cwd, "mcpServers": []},
                        timeout,
                    )
                    ref.generation = agent.generation
                    return ref.acp_session_id
        sid = await self._resume_persisted(ctx, agent, cwd) if ref is None else ""
        if not sid:
            result = await agent.call("session/new", {"cwd": cwd, "mcpServers": []}, timeout)
            sid = coerce.text(result.get("sessionId")) if isinstance(result, dict) else ""
            if not sid:
                raise AgentError("agent answered session/new without a sessionId")
        # persisted with the session record: a restarted bridge resumes it (issue 6)
        ctx.session.upstream.update(
            {"acpSessionId": sid, "acpCwd": cwd, "acpProvider": agent.spec.name}
        )
        self._sessions[ctx.session_id] = AcpSessionRef(ctx.session, agent.generation, sid, cwd)
        self._sessions.move_to_end(ctx.session_id)
        while len(self._sessions) > MAX_TRACKED_SESSIONS:
            self._sessions.popitem(last=False)
        return sid

    async def _resume_persisted(self, ctx: TurnContext, agent: AcpAgent, cwd: str) -> str:
        """The ACP session recorded before a bridge restart, reloaded; "" if not possible."""
        up = ctx.session.upstream
        sid = up.get("acpSessionId", "")
        if not sid or up.get("acpCwd") != cwd or up.get("acpProvider") != agent.spec.name:
            return ""
        if not agent.can_load_session:
            return ""
        try:
            await agent.call(
                "session/load",
                {"sessionId": sid, "cwd": cwd, "mcpServers": []},
                self.config.agents.session_timeout,
            )
        except AgentError:
            return ""
        return sid

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        provider = self._providers[self._provider_id(ctx)]
        agent = self.agent(provider.id)
        try:
            cwd = self._cwd(ctx, provider)
        except AgentError as exc:  # the client's working directory: not an agent failure
            await ctx.emit_error(str(exc))
            return self.failure(ctx, str(exc))
        try:
            await agent.ensure_started()
            acp_sid = await self._acp_session(ctx, agent, cwd)
        except AgentError as exc:
            self._failed(provider.id, failure_kind(exc))
            await ctx.emit_error(str(exc))
            return self.failure(ctx, str(exc))
        state = TurnState(ctx, cwd, self)
        agent.sessions[acp_sid] = SessionHandlers(state.on_update, state.on_request)
        prompt = ctx.turn.prompt
        prompt_task = asyncio.get_running_loop().create_task(
            agent.call(
                "session/prompt",
                {
                    "sessionId": acp_sid,
                    "prompt": codec.content_blocks(
                        ctx.turn.params.raw.get(codec.PROMPT_BLOCKS_PARAM),
                        agent.init_result,
                        prompt,
                    ),
                },
                self.config.agents.prompt_timeout,
            ),
            name=f"acp-prompt:{ctx.turn_id}",
        )
        try:
            answer = await asyncio.shield(prompt_task)
        except AgentError as exc:
            self._failed(provider.id, failure_kind(exc))
            if exc.timed_out:
                await self._interrupt(agent, acp_sid, ctx, None)
            elif not agent.alive:  # pending permission requests die with the agent
                self.broker.close_session(ctx.session_id, AGENT_EXITED, str(exc)[:500])
            await ctx.emit_error(str(exc))
            return {**self.failure(ctx, str(exc)), **self._extras(state)}
        except asyncio.CancelledError:
            self._failed(provider.id, "cancelled")
            await self._interrupt(agent, acp_sid, ctx, prompt_task)
            raise
        finally:
            if not prompt_task.done():
                prompt_task.cancel()
            agent.sessions.pop(acp_sid, None)
        result = mapping.turn_result(
            transcript=state.transcript,
            prompt_result=answer,
            provider_id=provider.id,
            turn_id=ctx.turn_id,
            agent_session_id=acp_sid,
            working_directory=cwd,
        )
        result.update(self._extras(state))
        if result.get("cancelled"):
            await ctx.emit_error(CANCELLED)
        remote_fields(result, cwd)
        return result

    def _failed(self, provider_id: str, kind: str) -> None:
        self._metrics.upstream_failures.get(provider_id, kind).inc()
        log.warning("agent call failed", extra={"agent": provider_id, "kind": kind})

    @staticmethod
    def _extras(state: TurnState) -> dict[str, Any]:
        return {"permissions": state.permissions} if state.permissions else {}

    async def _interrupt(
        self,
        agent: AcpAgent,
        acp_sid: str,
        ctx: TurnContext,
        prompt_task: asyncio.Task[Any] | None,
    ) -> None:
        """ACP cancel: notify, answer pending permissions ``cancelled``, wait for the answer."""
        self.broker.cancel_session(ctx.session_id)
        self.terminals.kill_session(acp_sid)
        with contextlib.suppress(AgentError):
            await agent.notify("session/cancel", {"sessionId": acp_sid})
        if prompt_task is not None:
            with contextlib.suppress(AgentError, TimeoutError, asyncio.CancelledError):
                answer = await asyncio.wait_for(prompt_task, CANCEL_WAIT)
                log.info(
                    "agent turn cancelled",
                    extra={"agent": agent.spec.name, "stop_reason": str(answer)[:80]},
                )

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit_error(CANCELLED)
        return {**self.failure(ctx, CANCELLED), "cancelled": True, "stopReason": "cancelled"}

    async def close(self) -> None:
        await self.terminals.close()
        for agent in list(self._agents.values()):
            await agent.close()
        self._agents.clear()


class ProviderKindExecutor:
    """``single-agent`` executor choosing HTTP/WS forwarding or a local stdio agent."""

    def __init__(self, http: Any, stdio: StdioAgentExecutor) -> None:
        self._http = http
        self._stdio = stdio

    def _pick(self, ctx: TurnContext) -> Any:
        return self._stdio if self._stdio.handles(provider_id_of(ctx)) else self._http

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        result: dict[str, Any] = await self._pick(ctx).execute(ctx)
        return result

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        result: dict[str, Any] = await self._pick(ctx).cancelled(ctx)
        return result
