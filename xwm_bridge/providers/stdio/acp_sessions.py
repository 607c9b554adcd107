"""Bridge session → ACP session: open, authenticate, resume, configure.

One ACP session per bridge session, kept in a bounded LRU map. It is reused while
the bridge ``Session`` object (replaced by ``session.start``), the working
directory and the agent process are the same. Otherwise, when the session's
record names an earlier ACP session of the same provider and directory (agent
crash, bridge restart), the agent is asked to continue it: ``session/resume`` if
it advertises ``sessionCapabilities.resume``, else ``session/load`` if it
advertises ``loadSession``. When neither works, a new ACP session is opened and,
if the bridge session already had prompts, they are given to the agent as
context in the first prompt (``replayed``). :class:`Opened` says which happened.

Every ``session/new|load|resume`` that fails with ``-32000`` (auth required) is
retried once after ``authenticate`` (:mod:`.auth`). After opening, the
provider's ``mode`` and ``options`` are applied, and on every turn the turn's
model (:mod:`.options`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.sessions import Session
from xwm_bridge.observability.logging import add_secrets
from xwm_bridge.providers.stdio import auth, mcp, options, registry
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError
from xwm_bridge.providers.stdio.catalog import AgentCatalog
from xwm_bridge.providers.stdio.options import OptionError, SessionOptions
from xwm_bridge.providers.stdio.prompt import history_context

log = logging.getLogger("xwm_bridge.agents")

MAX_TRACKED_SESSIONS = 4096
CONTINUED = "continued"
NEW = "new"
RESUMED = "resumed"
LOADED = "loaded"
REPLAYED = "replayed"


class SetupError(Exception):
    """The session cannot be opened or configured as asked (the turn fails)."""


@dataclass(slots=True)
class AcpSessionRef:
    session: Session  # identity changes on session.start (registry.reset)
    agent: AcpAgent
    generation: int
    acp_session_id: str
    cwd: str
    options: SessionOptions = field(default_factory=SessionOptions)
    mcp_servers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Opened:
    ref: AcpSessionRef
    continuity: str
    #: text given before the prompt (the stored history, when ``replayed``)
    context: str = ""
    #: a model note for the result (a remembered model the agent does not offer)
    model_note: str = ""
    skipped_mcp: tuple[tuple[str, str], ...] = ()


class AcpSessions:
    def __init__(self, config: BridgeConfig, catalog: AgentCatalog) -> None:
        self._config = config
        self._catalog = catalog
        self._refs: OrderedDict[str, AcpSessionRef] = OrderedDict()

    @property
    def _timeout(self) -> float:
        return self._config.agents.session_timeout

    # --- authentication -------------------------------------------------------------

    async def authenticate(self, agent: AcpAgent, provider: ProviderConfig) -> None:
        """``authenticate`` with the planned method (once per agent process)."""
        entry = registry.entry_for(provider)
        try:
            chosen = auth.plan(provider, agent.features, entry, agent.spec.env)
        except auth.AuthUnavailable as exc:
            raise SetupError(str(exc)) from None
        try:
            await agent.call("authenticate", chosen.params, self._timeout)
        except AgentError as exc:
            raise SetupError(
                f"agent {provider.id}: authenticate with {chosen.method} failed: {exc}"
            ) from None
        agent.authenticated = chosen.method
        log.info(
            "agent authenticated",
            extra={"agent": provider.id, "method": chosen.method, "key": chosen.key_source},
        )

    async def _call(
        self, agent: AcpAgent, provider: ProviderConfig, method: str, params: dict[str, Any]
    ) -> Any:
        """A session call, retried once after ``authenticate`` on auth required."""
        try:
            return await agent.call(method, params, self._timeout)
        except AgentError as exc:
            if exc.code != auth.AUTH_REQUIRED or agent.authenticated:
                raise
            log.info("agent asks for authentication", extra={"agent": provider.id, "call": method})
        await self.authenticate(agent, provider)
        return await agent.call(method, params, self._timeout)

    # --- opening --------------------------------------------------------------------

    def _mcp(self, ctx: TurnContext, agent: AcpAgent, provider: ProviderConfig) -> Any:
        raw = ctx.turn.params.raw.get("mcpServers")
        try:
            client = mcp.parse_client(raw)
        except mcp.McpError as exc:
            raise SetupError(str(exc)) from None
        if client and not provider.client_mcp_servers:
            raise SetupError(
                f"provider {provider.id} does not accept MCP servers from clients "
                "(providers[].client_mcp_servers is false)"
            )
        add_secrets(mcp.secret_values(client))
        return mcp.select(provider, self._config, agent.features, client)

    async def open(
        self, ctx: TurnContext, agent: AcpAgent, provider: ProviderConfig, cwd: str
    ) -> Opened:
        """The ACP session of this turn, configured; raises AgentError / SetupError."""
        if provider.auth_on_start and not agent.authenticated:
            await self.authenticate(agent, provider)
        ref = self._refs.get(ctx.session_id)
        if (
            ref is not None
            and ref.session is ctx.session
            and ref.cwd == cwd
            and ref.agent is agent
            and ref.generation == agent.generation
        ):
            self._refs.move_to_end(ctx.session_id)
            return await self._configure(ctx, agent, provider, ref, CONTINUED, "", ())
        selection = self._mcp(ctx, agent, provider)
        servers = list(selection.servers)
        up = ctx.session.upstream
        earlier = coerce.text(up.get("acpSessionId"))
        if up.get("acpCwd") != cwd or up.get("acpProvider") != provider.id:
            earlier = ""
        features = agent.features
        answer: Any = None
        continuity = ""
        if earlier:
            params = {"sessionId": earlier, "cwd": cwd, "mcpServers": servers}
            attempts = [("session/resume", RESUMED)] if features.resume_session else []
            if features.load_session:
                attempts.append(("session/load", LOADED))
            for method, label in attempts:
                try:
                    answer = await self._call(agent, provider, method, params)
                except AgentError as exc:
                    log.info(
                        "agent could not continue the session",
                        extra={"agent": provider.id, "call": method, "error": str(exc)},
                    )
                    continue
                continuity = label
                break
        context = ""
        sid = earlier
        if not continuity:
            answer = await self._call(
                agent, provider, "session/new", {"cwd": cwd, "mcpServers": servers}
            )
            sid = coerce.text(answer.get("sessionId")) if isinstance(answer, dict) else ""
            if not sid:
                raise AgentError("agent answered session/new without a sessionId")
            before = ctx.session.history[:-1] if ctx.turn.method == "session.message" else []
            context = history_context(before)
            continuity = REPLAYED if context else NEW
            if up.get("acpSessionId") != sid:
                up.pop("acpCost", None)  # the agent's cumulative cost starts again
        # persisted with the session record: a restarted bridge continues it (issue 6)
        up.update({"acpSessionId": sid, "acpCwd": cwd, "acpProvider": provider.id})
        ref = AcpSessionRef(
            ctx.session,
            agent,
            agent.generation,
            sid,
            cwd,
            SessionOptions.of(answer),
            tuple(selection.names()),
        )
        self._refs[ctx.session_id] = ref
        self._refs.move_to_end(ctx.session_id)
        while len(self._refs) > MAX_TRACKED_SESSIONS:
            self._refs.popitem(last=False)
        self._catalog.learn_session(provider.id, ref.options)
        await self._apply_session_options(agent, provider, ref)
        return await self._configure(
            ctx, agent, provider, ref, continuity, context, selection.skipped
        )

    # --- options ----------------------------------------------------------------------

    async def _set(
        self, agent: AcpAgent, provider: ProviderConfig, call: tuple[Any, ...]
    ) -> dict[str, Any]:
        method, params = call[0], call[1]
        try:
            answer = await agent.call(method, params, self._timeout)
        except AgentError as exc:
            raise SetupError(f"agent {provider.id}: {method} failed: {exc}") from None
        return answer if isinstance(answer, dict) else {}

    @staticmethod
    def _after_set(ref: AcpSessionRef, answer: dict[str, Any], what: str, value: str) -> None:
        """The session's options after a successful set: the answer's configOptions
        when it has them, else the value asked for."""
        updated = SessionOptions.of(answer, ref.options)
        if "configOptions" not in answer:
            updated = updated.with_current(**{what: value})
        ref.options = updated

    async def _apply_session_options(
        self, agent: AcpAgent, provider: ProviderConfig, ref: AcpSessionRef
    ) -> None:
        """The provider's ``mode`` and ``options`` on a newly opened session."""
        sid = ref.acp_session_id
        try:
            if provider.mode:
                call = options.select_call(sid, ref.options.mode, provider.mode, "mode")
                if call is not None:
                    self._after_set(ref, await self._set(agent, provider, call), "mode", call[2])
            for item in provider.options:
                option = options.option_call(sid, ref.options, item)
                if option is not None:
                    answer = await self._set(agent, provider, option)
                    ref.options = SessionOptions.of(answer, ref.options)
        except OptionError as exc:
            raise SetupError(f"agent {provider.id}: {exc} (providers[].mode/options)") from None

    async def _configure(
        self,
        ctx: TurnContext,
        agent: AcpAgent,
        provider: ProviderConfig,
        ref: AcpSessionRef,
        continuity: str,
        context: str,
        skipped: tuple[tuple[str, str], ...],
    ) -> Opened:
        """This turn's model: the client's or router's (explicit, remembered), else the
        provider's ``model``. A remembered one the agent lacks is only noted."""
        wanted = coerce.text(ctx.params.get("model")) or provider.model
        decision = ctx.turn.decision
        lenient = bool(
            decision.model and not ctx.turn.routing.explicit_model and wanted == decision.model
        )
        note = ""
        if wanted:
            try:
                call = options.select_call(ref.acp_session_id, ref.options.model, wanted, "model")
            except OptionError as exc:
                if not lenient:
                    raise SetupError(f"agent {provider.id}: {exc}") from None
                note = f"remembered model not used: {exc}"
            else:
                if call is not None:
                    self._after_set(ref, await self._set(agent, provider, call), "model", call[2])
        return Opened(ref, continuity, context, note, skipped)

    def forget(self, session_id: str) -> None:
        self._refs.pop(session_id, None)
