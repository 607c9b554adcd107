"""Single-agent turns routed to a local stdio ACP agent (``kind: stdio`` providers).

A turn: acquire the agent process (:mod:`.processes`: one per provider; one per
provider and working directory under ``agents.sandbox: bwrap``, at most
``agents.max_sandboxed_processes``), start it if needed, open or continue
the ACP session (:mod:`.acp_sessions`: auth, resume/load, mode, options, model),
build the prompt blocks (:mod:`.prompt`), run ``session/prompt`` and account for
its usage (:mod:`xwm_bridge.core.usage`: turn result, session totals, metrics).
``session.cancel`` sends ACP ``session/cancel``, answers pending permission
requests with ``cancelled`` and waits briefly for the agent's ``stopReason:
cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.executors import CANCELLED
from xwm_bridge.core.handles import cancel_arrived
from xwm_bridge.core.usage import RECORD_KEY, TurnUsage, Usage
from xwm_bridge.observability.logging import capped
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.providers.artifacts import ArtifactLimits
from xwm_bridge.providers.collector import remote_fields
from xwm_bridge.providers.single_agent import failure_result, provider_id_of
from xwm_bridge.providers.stdio import codec, mapping, prompt
from xwm_bridge.providers.stdio.acp_sessions import AcpSessions, Opened, SetupError
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, SessionHandlers
from xwm_bridge.providers.stdio.catalog import AgentCatalog
from xwm_bridge.providers.stdio.permissions import AGENT_EXITED, PermissionBroker
from xwm_bridge.providers.stdio.policy import PolicyStore
from xwm_bridge.providers.stdio.processes import AgentBusy, AgentProcesses
from xwm_bridge.providers.stdio.terminal import Terminals
from xwm_bridge.providers.stdio.turn_state import TurnState
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.agents")

CANCEL_WAIT = 5.0
#: distinct ``model`` label values per provider in /metrics (then ``other``)
MAX_MODEL_LABELS = 32
_CURRENCY = re.compile(r"[A-Z]{3}")


def currency_label(currency: str) -> str:
    """The ``currency`` label of ``xwm_agent_cost_total``: an ISO 4217-shaped code the
    agent sent, else ``other`` (fullmatch: ``^…$`` with ``match`` let ``"USD\\n"`` in)."""
    return currency if _CURRENCY.fullmatch(currency) else "other"


def failure_kind(exc: AgentError) -> str:
    """The ``kind`` of ``xwm_upstream_errors_total`` for a failed agent call."""
    if exc.timed_out:
        return "timeout"
    return "remote_error" if exc.code is not None else "transport"


class StdioAgentExecutor:
    def __init__(
        self,
        config: BridgeConfig,
        broker: PermissionBroker,
        metrics: Metrics | None = None,
        catalog: AgentCatalog | None = None,
    ) -> None:
        self.config = config
        self.broker = broker
        self.metrics = metrics
        self._metrics = metrics or Metrics()
        self.policy = PolicyStore(
            config.agents.permission_rules, config.agents.permission_rules_file
        )
        self.terminals = Terminals(config.agents)
        self.catalog = catalog or AgentCatalog()
        self.sessions = AcpSessions(config, self.catalog)
        self._providers = {p.id.lower(): p for p in config.available_providers if p.is_stdio}
        self.processes = AgentProcesses(config, self._providers)
        self._model_labels: dict[str, set[str]] = {}
        #: where a turn's attachments and artifacts may be read from, and how much
        self._file_limits = ArtifactLimits.of_config(config)

    def handles(self, provider_id: str) -> bool:
        return provider_id.lower() in self._providers

    def providers(self) -> list[ProviderConfig]:
        return list(self._providers.values())

    async def acquire(self, provider_id: str, cwd: str = "") -> AcpAgent:
        """The provider's agent process, held until :meth:`release` (:mod:`.processes`)."""
        return await self.processes.acquire(provider_id, cwd)

    def release(self, agent: AcpAgent) -> None:
        self.processes.release(agent)

    def using(
        self, provider_id: str, cwd: str = ""
    ) -> contextlib.AbstractAsyncContextManager[AcpAgent]:
        """:meth:`acquire` … :meth:`release` around one use of the process."""
        return self.processes.using(provider_id, cwd)

    def set_protocol_version(self, provider_id: str, version: int) -> None:
        self.processes.set_protocol_version(provider_id, version)

    def status(self) -> list[dict[str, Any]]:
        """Every configured stdio agent: started or not, restarts, last error."""
        return self.processes.status()

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

    async def _start(self, agent: AcpAgent, provider: ProviderConfig) -> None:
        fresh = not (agent.alive and agent.init_result)
        init = await agent.ensure_started()
        if fresh:
            self.catalog.learn_init(provider.id, init)

    async def _prompt_blocks(self, ctx: TurnContext, agent: AcpAgent, opened: Opened) -> Any:
        raw = ctx.turn.params.raw
        items: list[prompt.Item] = []
        if raw.get("attachments") or raw.get("artifacts"):
            items = await asyncio.to_thread(
                prompt.load, raw.get("attachments"), raw.get("artifacts"), self._file_limits
            )
        # an ACP client's own prompt blocks (images, resources) stand for the prompt text
        acp_blocks = raw.get(codec.PROMPT_BLOCKS_PARAM)
        content = (
            codec.content_blocks(acp_blocks, agent.init_result, ctx.turn.prompt)
            if isinstance(acp_blocks, list) and acp_blocks
            else None
        )
        return prompt.compose(ctx.turn.prompt, items, agent.features, opened.context, content)

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        provider = self._providers[provider_id_of(ctx)]
        try:
            cwd = self._cwd(ctx, provider)
        except AgentError as exc:  # the client's working directory: not an agent failure
            await ctx.emit_error(str(exc))
            return self.failure(ctx, str(exc))
        try:
            agent = await self.acquire(provider.id, cwd)
        except AgentError as exc:
            if not isinstance(exc, AgentBusy):  # no free place is not the agent's failure
                self._failed(ctx, provider.id, failure_kind(exc), exc)  # e.g. bwrap is missing
            await ctx.emit_error(str(exc))
            return self.failure(ctx, str(exc))
        try:
            return await self._run(ctx, provider, cwd, agent)
        finally:
            self.release(agent)

    async def _run(
        self, ctx: TurnContext, provider: ProviderConfig, cwd: str, agent: AcpAgent
    ) -> dict[str, Any]:
        try:
            await self._start(agent, provider)
            opened = await self.sessions.open(ctx, agent, provider, cwd)
            blocks, attachments = await self._prompt_blocks(ctx, agent, opened)
        except (AgentError, SetupError) as exc:
            if isinstance(exc, AgentError):  # not a setup problem (model, auth method)
                self._failed(ctx, provider.id, failure_kind(exc), exc)
            await ctx.emit_error(str(exc))
            return self.failure(ctx, str(exc))
        acp_sid = opened.ref.acp_session_id
        state = TurnState(ctx, cwd, self, opened.ref, agent_env=agent.spec.env, agent=agent)
        if agent.on_gone is None:  # its terminals go with its process, in every session
            agent.on_gone = functools.partial(self._agent_gone, agent)
        state.usage.cost_before = _float(ctx.session.upstream.get("acpCost"))
        agent.sessions[acp_sid] = SessionHandlers(
            state.on_update, state.on_request, self._on_exit(ctx)
        )
        # owned by the supervisor: on cancel the turn sends session/cancel and still waits
        # (bounded) for the agent's answer to this prompt
        prompt_task = ctx.supervisor.spawn(
            agent.call(
                "session/prompt",
                {"sessionId": acp_sid, "prompt": blocks},
                self.config.agents.prompt_timeout,
            ),
            name=f"acp-prompt:{ctx.turn_id}",
            awaited=True,  # its failure is the turn's, logged as such below
        )
        extras = self._setup_fields(opened, attachments)
        try:
            answer = await asyncio.shield(prompt_task)
        except AgentError as exc:
            self._failed(ctx, provider.id, failure_kind(exc), exc)
            if exc.timed_out:
                await self._interrupt(agent, acp_sid, ctx, None)
            elif not agent.alive:  # pending permission requests die with the agent
                self.broker.close_session(ctx.session_id, AGENT_EXITED, capped(str(exc), 500))
                await agent.withdrawn_requests_ended()  # their resolutions come first
            await ctx.emit_error(str(exc))
            self._account(ctx, provider, opened, state.usage)
            return {**self.failure(ctx, str(exc)), **extras, **self._extras(state)}
        except asyncio.CancelledError:
            cancel_arrived()  # not sent again into the wait for the agent's answer
            self._failed(ctx, provider.id, "cancelled")
            await self._interrupt(agent, acp_sid, ctx, prompt_task)
            self._account(ctx, provider, opened, state.usage)
            raise
        finally:
            if not prompt_task.done():
                prompt_task.cancel()
            agent.sessions.pop(acp_sid, None)
        state.usage.observe_answer(answer)
        result = mapping.turn_result(
            transcript=state.transcript,
            prompt_result=answer,
            provider_id=provider.id,
            turn_id=ctx.turn_id,
            agent_session_id=acp_sid,
            working_directory=cwd,
        )
        result.update(extras)
        result.update(self._extras(state))
        result.update(self._account(ctx, provider, opened, state.usage))
        if result.get("cancelled"):
            await ctx.emit_error(CANCELLED)
        remote_fields(result, cwd)
        return result

    def _agent_gone(self, agent: AcpAgent, message: str) -> None:
        """``agent``'s process exited on its own or was closed: the terminals it created
        go too."""
        self.terminals.release_owner(agent)

    def _on_exit(self, ctx: TurnContext) -> Callable[[str], None]:
        """When the turn's agent process exits on its own (``AcpAgent._withdraw``): its
        pending permission requests are withdrawn (``agent_exited``) before its requests
        are cancelled (its terminals go with the agent's: :meth:`_agent_gone`)."""

        def on_exit(message: str) -> None:
            self.broker.close_session(ctx.session_id, AGENT_EXITED, capped(message, 500))

        return on_exit

    def _failed(self, ctx: TurnContext, pid: str, kind: str, exc: Exception | None = None) -> None:
        """The metric, and a warning with the session, provider, kind and error."""
        self._metrics.upstream_failures.get(pid, kind).inc()
        error = capped(str(exc), 500) if exc is not None else ""  # "agent": the old name
        fields = {"session_id": ctx.session_id[:128], "provider": pid, "agent": pid, "kind": kind}
        log.warning("agent call failed", extra={**fields, "error": error} if error else fields)

    @staticmethod
    def _setup_fields(opened: Opened, attachments: list[dict[str, Any]]) -> dict[str, Any]:
        """What the turn ran with: agent model and mode, continuity, MCP servers."""
        options = opened.ref.options
        out: dict[str, Any] = {"sessionContinuity": opened.continuity}
        if options.model.current:
            out["agentModel"] = options.model.current
        if options.mode.current:
            out["agentMode"] = options.mode.current
        if opened.model_note:
            out["agentModelNote"] = opened.model_note
        if opened.ref.mcp_servers:
            out["mcpServers"] = list(opened.ref.mcp_servers)
        if opened.skipped_mcp:
            out["mcpServersSkipped"] = [{"name": n, "reason": r} for n, r in opened.skipped_mcp]
        if attachments:
            out["attachments"] = attachments
        return out

    @staticmethod
    def _extras(state: TurnState) -> dict[str, Any]:
        return {"permissions": state.permissions} if state.permissions else {}

    def _account(
        self, ctx: TurnContext, provider: ProviderConfig, opened: Opened, usage: TurnUsage
    ) -> dict[str, Any]:
        """Usage of the turn: session totals (record), metrics, result fields."""
        if not usage.reported:
            return {}
        turn = usage.result()
        up = ctx.session.upstream
        if usage.cost_now is not None:
            up["acpCost"] = repr(usage.cost_now)
        totals = Usage.from_record(up) + turn
        up[RECORD_KEY] = totals.record()
        if self.metrics is not None:
            model = self._model_label(provider.id, opened.ref.options.model.current)
            counts = self.metrics.agent_token_counts
            for kind in ("input", "output", "thought", "cached_read", "cached_write"):
                value = getattr(turn, kind)
                if value:
                    counts.get(provider.id, model, kind).inc(value)
            if turn.cost:
                currency = currency_label(turn.currency)
                self.metrics.agent_costs.get(provider.id, model, currency).inc(turn.cost)
        return {"usage": usage.wire(), "sessionUsage": {**totals.wire(), "turns": totals.turns}}

    def _model_label(self, provider_id: str, model: str) -> str:
        """A bounded label value: a model the agent offered, else ``other``."""
        if not model:
            return "unknown"
        seen = self._model_labels.setdefault(provider_id, set())
        if model in seen:
            return model
        if model in self.catalog.models(provider_id) and len(seen) < MAX_MODEL_LABELS:
            seen.add(model)
            return model
        return "other"

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
                answer = await wait_for(prompt_task, CANCEL_WAIT)
                said = answer.get("stopReason") if isinstance(answer, dict) else None
                log.info(
                    "agent turn cancelled",
                    extra={
                        "agent": agent.spec.name,
                        "stop_reason": said if isinstance(said, str) else str(answer)[:80],
                    },
                )

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit_error(CANCELLED)
        return {**self.failure(ctx, CANCELLED), "cancelled": True, "stopReason": "cancelled"}

    async def close(self) -> None:
        await self.terminals.close()
        await self.processes.close()


def _float(value: Any) -> float | None:
    try:
        return float(value) if value else None
    except (TypeError, ValueError):
        return None


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
