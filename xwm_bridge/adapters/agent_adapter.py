"""``xwm-bridge agent-adapter`` (alias ``gemini-adapter``): one stdio ACP agent as a
bridge-protocol service (adapters.md §1, with its weaknesses fixed).

Same HTTP/WS/SSE edges, auth, origin and size rules as ``serve`` but only the
``/acp/rpc`` and ``/acp`` routes. ``session.*`` run through the normal turn
pipeline, always routed to the one agent (streaming, cancel, permissions, fs as
in ``serve``); ``acp.capabilities`` is built from the agent's real ``initialize``
answer; ``gemini.initialize`` and ``gemini.raw`` talk to the agent directly.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.methods import BridgeMethods, session_methods
from xwm_bridge.config import BridgeConfig, ConfigError, ProviderConfig
from xwm_bridge.config.validate import is_origin_rule
from xwm_bridge.core.context import CallContext, Handler
from xwm_bridge.core.modes import Mode
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError

DEFAULT_LISTEN = "127.0.0.1:8791"
DEFAULT_ORIGINS = "https://xworkmate.svc.plus,http://localhost:*,http://127.0.0.1:*"
#: the original used ``--experimental-acp``, which today's gemini-cli deprecates.
DEFAULT_ARGS = "--acp"
RAW_TIMEOUT = 120.0


@dataclass(frozen=True, slots=True)
class AdapterSettings:
    """The original's ``GEMINI_ADAPTER_*`` environment (adapters.md §1.1)."""

    listen: str = DEFAULT_LISTEN
    agent_bin: str = "gemini"
    agent_args: tuple[str, ...] = (DEFAULT_ARGS,)
    protocol_version: int = 1
    auth_token: str = field(default="", repr=False)
    provider_id: str = "gemini"
    provider_label: str = "Gemini"
    allowed_origins: tuple[str, ...] = tuple(DEFAULT_ORIGINS.split(","))
    upstream_method: str = ""
    #: which of agent_bin / agent_args / provider_label came from an env var or a
    #: flag: those win over the YAML provider, the defaults do not
    overrides: frozenset[str] = frozenset()

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        listen: str | None = None,
        agent_bin: str | None = None,
        agent_args: str | None = None,
    ) -> AdapterSettings:
        def get(name: str, default: str) -> str:
            return coerce.env_text(env, name) or default

        version_text = get("GEMINI_ADAPTER_PROTOCOL_VERSION", "1")
        try:  # ASCII digits: int() also reads "١"
            version = int(version_text) if version_text.isascii() else 0
        except ValueError:
            version = 0
        if version <= 0:
            raise ConfigError(
                "GEMINI_ADAPTER_PROTOCOL_VERSION: expected a positive integer, "
                f"got {version_text!r}"
            )
        binary = agent_bin or get("GEMINI_ADAPTER_BIN", get("ACP_GEMINI_BIN", ""))
        raw_args = agent_args if agent_args is not None else get("GEMINI_ADAPTER_ARGS", "")
        label = get("GEMINI_ADAPTER_PROVIDER_LABEL", "")
        overrides = {
            name
            for name, given in (
                ("agent_bin", binary),
                ("agent_args", agent_args is not None or raw_args),
                ("provider_label", label),
            )
            if given
        }
        args = raw_args if "agent_args" in overrides else DEFAULT_ARGS
        try:
            argv = tuple(shlex.split(args))  # quotes honoured (the original split on spaces)
        except ValueError as exc:  # an unclosed quote: say whose
            source = "--agent-args" if agent_args is not None else "GEMINI_ADAPTER_ARGS"
            raise ConfigError(f"{source}: {exc}") from None
        origins = get("GEMINI_ADAPTER_ALLOWED_ORIGINS", DEFAULT_ORIGINS)
        entries = [o.strip() for o in origins.split(",") if o.strip()]
        for i, entry in enumerate(entries):
            if not is_origin_rule(entry):  # it allowed nothing (as allowed_origins)
                raise ConfigError(
                    f"GEMINI_ADAPTER_ALLOWED_ORIGINS[{i}]: expected scheme://host[:port] "
                    f"or scheme://host:*, got {entry!r}"
                )
        return cls(
            listen=listen or get("GEMINI_ADAPTER_LISTEN_ADDR", DEFAULT_LISTEN),
            agent_bin=binary or "gemini",
            agent_args=argv,
            protocol_version=version,
            auth_token=get("GEMINI_ADAPTER_AUTH_TOKEN", ""),
            provider_id=get("GEMINI_ADAPTER_PROVIDER_ID", "gemini"),
            provider_label=label or "Gemini",
            allowed_origins=tuple(entries),
            upstream_method=get("GEMINI_ADAPTER_UPSTREAM_METHOD", ""),
            overrides=frozenset(overrides),
        )

    def bridge_config(self, base: BridgeConfig) -> BridgeConfig:
        """The bridge config with this adapter's listen/auth/origins and its one agent.

        A ``kind: stdio`` provider with the adapter's id in the YAML file is the
        agent: its label, command, env, cwd and ``fs_read`` are used; the
        ``GEMINI_ADAPTER_*`` env vars and the flags (``--agent-bin``,
        ``--agent-args``) replace the label, the binary or the arguments they name.
        Without one, the original's defaults (``gemini --acp``, label ``Gemini``).
        """
        existing = next(
            (p for p in base.providers if p.id.lower() == self.provider_id.lower() and p.is_stdio),
            None,
        )
        yaml_cmd = existing.command if existing is not None else ()
        binary = self.agent_bin if "agent_bin" in self.overrides or not yaml_cmd else yaml_cmd[0]
        args = self.agent_args if "agent_args" in self.overrides or not yaml_cmd else yaml_cmd[1:]
        label = self.provider_label
        if existing is not None and existing.label and "provider_label" not in self.overrides:
            label = existing.label
        # gemini-cli cannot create files when fs.readTextFile is advertised
        is_gemini = os.path.basename(binary).startswith("gemini")
        provider = existing or ProviderConfig(id=self.provider_id, fs_read=not is_gemini)
        provider = replace(
            provider, label=label, kind="stdio", enabled=True, command=(binary, *args)
        )
        return replace(
            base,
            listen=self.listen,
            auth_token=self.auth_token,
            allowed_origins=self.allowed_origins,
            providers=(provider,),
            agents=replace(base.agents, detect=False),  # the one agent, nothing detected
        )


#: the adapter's routes (adapters.md §1.2): everything else answers 404
ADAPTER_PATHS = ("/acp/rpc", "/acp", "/livez", "/readyz", "/metrics")


class AdapterMethods:
    """The adapter's method table: the bridge's ``session.*`` handlers with every turn
    routed to the one agent, its own ``acp.capabilities``, ``gemini.initialize`` and
    ``gemini.raw``; no router, mounts or gateway methods (adapters.md §1.5)."""

    def __init__(self, bridge: Bridge, settings: AdapterSettings) -> None:
        self._settings = settings
        #: the YAML provider's label unless GEMINI_ADAPTER_PROVIDER_LABEL says otherwise
        self._label = bridge.config.providers[0].label or settings.provider_label
        self._base = BridgeMethods(bridge)
        self._agents = bridge.stdio_agents
        # every process of the provider (one per directory under bwrap), not only this one
        self._agents.set_protocol_version(settings.provider_id, settings.protocol_version)

    def _agent(self) -> AbstractAsyncContextManager[AcpAgent]:
        """The provider's process for one of the adapter's own calls, held from the
        executor for the call's length: tracked (shutdown closes it), counted by the
        sandbox's process cap, and never closed by it while the call runs."""
        return self._agents.using(self._settings.provider_id)

    def table(self) -> dict[str, Handler]:
        return {
            **session_methods(self._base),
            "acp.capabilities": self._adapter_capabilities,
            "session.start": self._adapter_turn,
            "session.message": self._adapter_turn,
            "gemini.initialize": self._gemini_initialize,
            "gemini.raw": self._gemini_raw,
        }

    def _provider(self) -> dict[str, str]:
        return {"id": self._settings.provider_id, "label": self._label}

    async def _adapter_capabilities(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        pid = self._settings.provider_id
        try:
            async with self._agent() as agent:
                init = await agent.ensure_started()
        except AgentError as exc:
            return {
                "singleAgent": False,
                "multiAgent": False,
                "providers": [],
                "providerCatalog": [],
                "capabilities": {"single_agent": False, "multi_agent": False, "providers": []},
                "success": False,
                "error": str(exc),
            }
        return {
            "singleAgent": True,
            "multiAgent": False,
            "providers": [pid],
            "providerCatalog": [{"providerId": pid, "label": self._label}],
            "capabilities": {"single_agent": True, "multi_agent": False, "providers": [pid]},
            "provider": self._provider(),
            "upstream": {
                "protocolVersion": init.get("protocolVersion"),
                "authMethods": init.get("authMethods"),
                "agentCapabilities": init.get("agentCapabilities"),
                "agentInfo": init.get("agentInfo"),
            },
        }

    async def _adapter_turn(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        if self._settings.upstream_method:
            return await self._configured_upstream(params)
        # every turn goes to the one agent, whatever routing the client sent
        routed = {
            **params,
            "routing": {
                "routingMode": "explicit",
                "explicitExecutionTarget": "singleAgent",
                "explicitProviderId": self._settings.provider_id,
            },
        }
        return await self._base.session_turn(routed, call, method)

    async def _configured_upstream(self, params: dict[str, Any]) -> dict[str, Any]:
        """adapters.md §1.7.1: params sent verbatim under the configured method."""
        pid, upstream = self._settings.provider_id, self._settings.upstream_method
        base = {"provider": pid, "mode": Mode.SINGLE_AGENT.value}
        try:
            async with self._agent() as agent:
                await agent.ensure_started()
                result = await agent.call(upstream, params, RAW_TIMEOUT)
        except AgentError as exc:
            out = {"success": False, **base, "error": str(exc), "upstreamMethod": upstream}
            if exc.code is not None:
                out["upstreamError"] = {"code": exc.code, "message": str(exc)}
            return out
        if isinstance(result, dict) and result:
            return {**base, **result}
        return {"success": True, **base, "upstreamMethod": upstream, "upstream": result}

    async def _gemini_initialize(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        try:
            async with self._agent() as agent:
                init = await agent.ensure_started()
        except AgentError as exc:
            return {"success": False, "error": str(exc)}
        keys = ("protocolVersion", "authMethods", "agentCapabilities", "agentInfo")
        return {"success": True, "result": {k: init.get(k) for k in keys}}

    async def _gemini_raw(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        raw_method = params.get("method")
        if raw_method is not None and not isinstance(raw_method, str):
            raise RpcError(INVALID_PARAMS, "method must be a string")
        if not coerce.text(raw_method):
            return {"success": False, "error": "method is required"}
        raw_params = params.get("params")
        try:
            async with self._agent() as agent:
                await agent.ensure_started()
                result = await agent.call(
                    coerce.text(raw_method),
                    raw_params if isinstance(raw_params, dict) else {},
                    RAW_TIMEOUT,
                )
        except AgentError as exc:
            if exc.code is None:
                return {"success": False, "error": str(exc)}
            error = {"code": exc.code, "message": str(exc)}
            return {"success": True, "response": {"jsonrpc": "2.0", "error": error}}
        return {"success": True, "response": {"jsonrpc": "2.0", "result": result}}
