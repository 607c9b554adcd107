"""The known stdio ACP agents, and finding them at start.

Each entry was checked against the agent's own source or docs (``source``):
its command and arguments, the environment it reads (copied from the bridge's
environment into the agent's, nothing else is), where it keeps its state (made
writable under ``agents.sandbox: bwrap``) and the ``authMethods`` the bridge can
answer with an API key from that environment.

:func:`detect` turns the entries found in ``agents.search_paths`` or on ``PATH``
into ``kind: stdio`` providers. A provider the config names with the same id wins
over the entry; a built-in remote default (``DEFAULT_PROVIDERS``) with the same id
is replaced by the local agent. ``agents.detect: false`` turns this off and
``agents.detect_skip`` skips single entries.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xwm_bridge.config import DEFAULT_PROVIDERS, BridgeConfig, ProviderConfig

#: how an API key reaches the agent in ``authenticate``
META_STRING = "string"  # _meta: {"api-key": "<key>"} (gemini-cli)
META_OBJECT = "object"  # _meta: {"api-key": {"apiKey": "<key>"}} (codex-acp)
META_NONE = "env"  # no _meta: the agent reads the variable itself (qwen)


@dataclass(frozen=True, slots=True)
class ApiKeyAuth:
    """An ``authMethods`` entry the bridge can use with a key from the agent's env."""

    method: str
    #: variables of the agent's environment holding the key, first set one wins
    env: tuple[str, ...]
    meta: str = META_STRING


@dataclass(frozen=True, slots=True)
class AgentEntry:
    id: str
    label: str
    executable: str
    args: tuple[str, ...] = ()
    #: names or ``PREFIX_*`` copied from the bridge's environment
    env: tuple[str, ...] = ()
    #: the agent's own state: ``{home}``, ``{config}``, ``{data}``, ``{cache}``,
    #: ``{state}`` are the (XDG) directories of the agent's environment
    state: tuple[str, ...] = ()
    auth: tuple[ApiKeyAuth, ...] = ()
    #: advertise ``fs.readTextFile`` (gemini-cli cannot create files when it is)
    fs_read: bool = True
    #: ``NAME=value`` the agent needs to use the MCP servers a client gives it, set
    #: only for providers that give it some (``mcp_servers``, ``toolbridge``,
    #: ``client_mcp_servers``); the provider's ``env`` wins
    mcp_env: tuple[str, ...] = ()
    install: str = ""
    source: str = ""


XDG = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")

REGISTRY: tuple[AgentEntry, ...] = (
    AgentEntry(
        id="opencode",
        label="OpenCode",
        executable="opencode",
        args=("acp",),
        env=(
            "OPENCODE_*",
            *XDG,
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "OPENROUTER_API_KEY",
            "GOOGLE_GENERATIVE_AI_API_KEY",
            "GROQ_API_KEY",
            "DEEPSEEK_API_KEY",
            "MISTRAL_API_KEY",
            "XAI_API_KEY",
        ),
        state=("{data}/opencode", "{config}/opencode", "{cache}/opencode", "{state}/opencode"),
        # its one method, opencode-login, is `opencode auth login` in a terminal
        install="npm install -g opencode-ai",
        source="opencode 1.18.33 `initialize`; packages/opencode/src/flag/flag.ts, src/global",
    ),
    AgentEntry(
        id="gemini",
        label="Gemini CLI",
        executable="gemini",
        args=("--acp",),
        env=("GEMINI_*", "GOOGLE_*"),
        state=("{home}/.gemini",),
        auth=(ApiKeyAuth("gemini-api-key", ("GEMINI_API_KEY",), META_STRING),),
        fs_read=False,
        # gemini starts no MCP server, not even one given in session/new, in a folder
        # it does not trust (McpClientManager.startConfiguredMcpServers)
        mcp_env=("GEMINI_CLI_TRUST_WORKSPACE=true",),
        install="npm install -g @google/gemini-cli",
        source="@google/gemini-cli 0.61.0 bundle: GeminiAgent.initialize/authenticate, "
        "checkPathTrust",
    ),
    AgentEntry(
        id="codex",
        label="Codex",
        executable="codex-acp",
        env=("CODEX_*", "OPENAI_API_KEY", "MODEL_PROVIDER", "INITIAL_AGENT_MODE", "NO_BROWSER"),
        state=("{home}/.codex",),
        auth=(ApiKeyAuth("api-key", ("CODEX_API_KEY", "OPENAI_API_KEY"), META_OBJECT),),
        install="npm install -g @agentclientprotocol/codex-acp",
        source="github.com/agentclientprotocol/codex-acp README, src/CodexAuthMethod.ts",
    ),
    AgentEntry(
        id="claude",
        label="Claude Agent",
        executable="claude-agent-acp",
        env=("ANTHROPIC_*", "CLAUDE_*", "MAX_THINKING_TOKENS"),
        state=("{home}/.claude", "{home}/.claude.json"),
        # authMethods are terminal logins (or a client gateway); the SDK reads
        # ANTHROPIC_API_KEY itself
        install="npm install -g @agentclientprotocol/claude-agent-acp",
        source="github.com/agentclientprotocol/claude-agent-acp src/acp-agent.ts",
    ),
    AgentEntry(
        id="qwen",
        label="Qwen Code",
        executable="qwen",
        args=("--acp",),
        env=("QWEN_*", "OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"),
        state=("{home}/.qwen",),
        auth=(ApiKeyAuth("openai", ("OPENAI_API_KEY",), META_NONE),),
        install="npm install -g @qwen-code/qwen-code",
        source="ACP registry qwen-code/agent.json; QwenLM/qwen-code acp-integration/authMethods.ts",
    ),
    AgentEntry(
        id="goose",
        label="Goose",
        executable="goose",
        args=("acp",),
        env=(
            "GOOSE_*",
            *XDG,
            "OPENAI_API_KEY",
            "OPENAI_HOST",
            "ANTHROPIC_API_KEY",
            "OPENROUTER_API_KEY",
            "GOOGLE_API_KEY",
            "GROQ_API_KEY",
            "OLLAMA_HOST",
            "DATABRICKS_HOST",
            "DATABRICKS_TOKEN",
        ),
        state=("{config}/goose", "{data}/goose", "{state}/goose"),
        install="https://block.github.io/goose/docs/getting-started/installation",
        source="ACP registry goose/agent.json; block.github.io/goose config-files guide",
    ),
)

_BY_ID = {e.id: e for e in REGISTRY}


def entry(agent_id: str) -> AgentEntry | None:
    return _BY_ID.get(agent_id.lower())


def entry_for(provider: ProviderConfig) -> AgentEntry | None:
    """The registry entry of a stdio provider: same id, else same executable name."""
    found = entry(provider.id)
    if found is not None:
        return found
    exe = os.path.basename(provider.command[0]) if provider.command else ""
    return next((e for e in REGISTRY if e.executable == exe), None)


def state_paths(agent: AgentEntry | None, env: Mapping[str, str]) -> list[str]:
    """The agent's state directories (and files) in its environment."""
    if agent is None:
        return []
    home = env.get("HOME", "") or os.path.expanduser("~")

    def xdg(name: str, default: str) -> str:
        value = env.get(name, "")
        return value if os.path.isabs(value) else os.path.join(home, default)

    dirs = {
        "home": home,
        "config": xdg("XDG_CONFIG_HOME", ".config"),
        "data": xdg("XDG_DATA_HOME", ".local/share"),
        "cache": xdg("XDG_CACHE_HOME", ".cache"),
        "state": xdg("XDG_STATE_HOME", ".local/state"),
    }
    return [os.path.normpath(template.format(**dirs)) for template in agent.state]


# --- detection ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """One known or configured local agent: found (a provider) or not, and why."""

    id: str
    label: str
    found: bool
    source: str  # "registry" | "config"
    path: str = ""
    command: tuple[str, ...] = ()
    reason: str = ""

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "label": self.label, "found": self.found}
        out["source"] = self.source
        if self.found:
            out["path"] = self.path
            out["command"] = list(self.command)
        else:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, slots=True)
class Detection:
    config: BridgeConfig
    agents: tuple[AgentStatus, ...]

    @property
    def found(self) -> list[str]:
        return [a.id for a in self.agents if a.found]

    @property
    def missing(self) -> dict[str, str]:
        return {a.id: a.reason for a in self.agents if not a.found}


def which(executable: str, search_paths: tuple[str, ...], path: str) -> str | None:
    """``executable`` in ``search_paths`` first, then on ``path``; an absolute or
    relative path with a separator is taken as it is."""
    if os.sep in executable:
        return executable if os.access(executable, os.X_OK) else None
    for d in search_paths:
        found = shutil.which(executable, path=d)
        if found:
            return found
    return shutil.which(executable, path=path)


def not_found(executable: str) -> str:
    """Why :func:`which` found nothing: a path to a file that is there but cannot be
    run is not "not found" (the operator would look for a missing file)."""
    if os.sep in executable and os.path.isfile(executable):
        return f"command not executable: {executable}"
    return f"command not found: {executable}"


def _configured_status(p: ProviderConfig, config: BridgeConfig, path: str) -> AgentStatus:
    exe = p.command[0] if p.command else ""
    label = p.label or p.id
    if not exe:
        return AgentStatus(p.id, label, False, "config", reason="no command configured")
    found = which(exe, config.agents.search_paths, path)
    if found is None:
        return AgentStatus(p.id, label, False, "config", reason=not_found(exe), command=p.command)
    return AgentStatus(p.id, label, True, "config", path=found, command=p.command)


def detect(config: BridgeConfig, environ: Mapping[str, str] | None = None) -> Detection:
    """The config with the found agents added as providers, and what was found."""
    env = os.environ if environ is None else environ
    path = env.get("PATH", os.defpath)
    agents = config.agents
    defaults = set(DEFAULT_PROVIDERS)
    configured = {p.id.lower(): p for p in config.providers if p not in defaults}
    statuses: list[AgentStatus] = []
    for p in config.providers:
        if p.is_stdio and p.enabled:
            statuses.append(_configured_status(p, config, path))
    skip = {s.lower() for s in agents.detect_skip}
    detected: list[ProviderConfig] = []
    for e in REGISTRY:
        if e.id in configured:
            continue  # the config's provider of that id wins (listed above if stdio)
        label = e.label
        if not agents.detect:
            statuses.append(
                AgentStatus(e.id, label, False, "registry", reason="detection off (agents.detect)")
            )
            continue
        if e.id in skip:
            statuses.append(
                AgentStatus(e.id, label, False, "registry", reason="skipped (agents.detect_skip)")
            )
            continue
        found = which(e.executable, agents.search_paths, path)
        if found is None:
            reason = f"{e.executable} not found in agents.search_paths or PATH"
            if e.install:
                reason += f" (install: {e.install})"
            statuses.append(AgentStatus(e.id, label, False, "registry", reason=reason))
            continue
        command = (found, *e.args)
        statuses.append(AgentStatus(e.id, label, True, "registry", path=found, command=command))
        detected.append(
            ProviderConfig(
                id=e.id, label=f"{label} (local)", kind="stdio", command=command, fs_read=e.fs_read
            )
        )
    taken = {p.id.lower() for p in detected}
    kept = [p for p in config.providers if p.id.lower() not in taken]
    if all(p in defaults for p in config.providers):
        providers = (*detected, *kept)  # nothing configured: local agents route first
    else:
        providers = (*kept, *detected)
    return Detection(dataclasses.replace(config, providers=tuple(providers)), tuple(statuses))
