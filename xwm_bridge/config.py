"""One typed, frozen configuration: defaults < YAML file < environment < flags.

The YAML file is optional (``--config`` or ``XWM_BRIDGE_CONFIG``); strings in it
may use ``${VAR}`` / ``${VAR:-default}`` interpolation. Every environment
variable of the original keeps its name and default (spec ``config.md`` §2.1).
A bad value raises :class:`ConfigError` whose message names the key and the
problem in one line; the CLI prints it and exits with status 2.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

import yaml

from xwm_bridge import coerce
from xwm_bridge.endpoint import EndpointError, derive_endpoint
from xwm_bridge.netaddr import endpoint_of, parse_listen

DEFAULT_LISTEN = "127.0.0.1:8787"
DEFAULT_ALLOWED_ORIGINS = (
    "https://xworkmate.svc.plus",
    "http://localhost:*",
    "http://127.0.0.1:*",
)
MIB = 1024 * 1024
SECRET_MARK = "secret"
#: a credential: masked by ``doctor``, redacted from every log line and client reply
Secret = Annotated[str, SECRET_MARK]


class ConfigError(Exception):
    """A configuration problem, phrased as one line naming the key."""


MCP_TYPES = ("stdio", "http", "sse")
SANDBOXES = ("none", "bwrap")


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One MCP server given to a stdio agent on ``session/new`` (ACP ``McpServer``)."""

    name: str
    #: ``stdio`` (``command`` + ``args`` + ``env``), ``http`` or ``sse`` (``url`` + ``headers``)
    type: str = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    #: ``NAME=value`` items (secrets: redacted from logs)
    env: tuple[str, ...] = ()
    url: str = ""
    #: ``Name: value`` items (secrets: redacted from logs)
    headers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One upstream ACP provider of the catalog."""

    id: str
    label: str = ""
    endpoint: str = ""
    enabled: bool = True
    #: ``Authorization`` value sent upstream; ``None`` = the shared default
    #: derived from INTERNAL_SERVICE_TOKEN / BRIDGE_AUTH_TOKEN; ``""`` = none.
    auth_header: Secret | None = None
    #: ask HTTP upstreams for SSE so their notifications stream through.
    stream: bool = True
    connect_timeout: float = 10.0
    #: longest silence allowed while waiting for upstream bytes or frames.
    read_timeout: float = 120.0
    #: hard cap on one forwarded turn.
    total_timeout: float = 600.0
    #: ``http`` (endpoint: ACP over HTTP/WS) or ``stdio`` (command: a local Zed-ACP agent).
    kind: str = "http"
    #: stdio agents: argv run without a shell, e.g. ``[opencode, acp]``.
    command: tuple[str, ...] = ()
    #: stdio agents: extra environment, ``NAME=value`` items.
    env: tuple[str, ...] = ()
    #: stdio agents: the process working directory (default: the bridge's).
    cwd: str = ""
    #: stdio agents: advertise ``fs.readTextFile`` (gemini-cli fails to create new
    #: files when it is advertised: set false for gemini).
    fs_read: bool = True
    #: model ids this provider offers; the ACP front door shows them as a ``model`` option.
    models: tuple[str, ...] = ()
    #: stdio agents: names (or ``PREFIX_*``) copied from the bridge's environment
    #: into the agent's, on top of PATH/HOME/LANG/TMPDIR and the registry entry's.
    pass_env: tuple[str, ...] = ()
    #: stdio agents: the ``authMethods`` id to ``authenticate`` with when asked.
    auth_method: str = ""
    #: stdio agents: API key sent in ``authenticate`` ``_meta`` (secret).
    auth_api_key: Secret = ""
    #: stdio agents: authenticate right after ``initialize``, not only on demand.
    auth_on_start: bool = False
    #: stdio agents: model when the turn names none (``configOptions`` / ``session/set_model``).
    model: str = ""
    #: stdio agents: session mode set on every new session.
    mode: str = ""
    #: stdio agents: further ``configId=value`` session options.
    options: tuple[str, ...] = ()
    #: stdio agents: MCP servers given on ``session/new``/``load``/``resume``.
    mcp_servers: tuple[McpServerConfig, ...] = ()
    #: stdio agents: add the bridge's own toolbridge as an MCP server.
    toolbridge: bool = False
    #: stdio agents: accept ``mcpServers`` sent by clients in turn params.
    client_mcp_servers: bool = False
    #: stdio agents under ``agents.sandbox: bwrap``: more writable paths.
    writable_paths: tuple[str, ...] = ()

    @property
    def is_stdio(self) -> bool:
        return self.kind == "stdio"

    @property
    def available(self) -> bool:
        if self.is_stdio:
            return self.enabled and bool(self.command)
        return self.enabled and bool(self.endpoint.strip())


DEFAULT_PROVIDERS = (
    ProviderConfig("codex", "Codex", "https://acp-server.svc.plus/codex/acp/rpc"),
    ProviderConfig("opencode", "OpenCode", "https://acp-server.svc.plus/opencode/acp/rpc"),
    ProviderConfig("gemini", "Gemini", "https://acp-server.svc.plus/gemini/acp/rpc"),
)


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on everything a client can make the bridge hold or wait for."""

    max_body_bytes: int = 4 * MIB
    max_ws_message_bytes: int = 4 * MIB
    #: turns allowed to wait behind the running one on a thread.
    max_queue_depth: int = 32
    #: a session with no turn for this long is forgotten.
    session_idle_ttl: float = 3600.0
    request_read_timeout: float = 30.0
    #: a new connection must send its first complete request head within this (above
    #: the 10 s browsers keep an unused preconnected socket).
    header_read_timeout: float = 30.0
    #: an idle keep-alive connection (and a later request head on it) is closed after
    #: this; above the 60 s nginx keeps idle upstream connections.
    keepalive_timeout: float = 75.0
    #: open connections per client IP (0 = no cap); behind a proxy all share its IP.
    max_connections_per_address: int = 256
    #: a client that cannot take a notification within this is dropped from the stream.
    notification_send_timeout: float = 30.0
    ws_heartbeat: float = 30.0
    #: seconds between ``: keep-alive`` comments on a silent SSE stream (0 = off)
    sse_keepalive: float = 15.0
    artifact_max_files: int = 24
    artifact_max_file_bytes: int = 2 * MIB
    artifact_max_total_bytes: int = 16 * MIB
    upstream_cancel_timeout: float = 5.0
    bootstrap_requests_per_minute: int = 10
    bootstrap_timeout: float = 10.0
    shutdown_grace: float = 20.0


@dataclass(frozen=True, slots=True)
class MultiAgentConfig:
    """The planner → worker → reviewer loop of multi-agent turns."""

    #: worker/reviewer rounds at most (the planner runs once).
    max_iterations: int = 3
    #: reviewer score (0-10) at or above which a draft is accepted.
    score_threshold: float = 8.0
    #: workers drafting in parallel per iteration.
    workers: int = 1
    #: deadline for each model call, in seconds.
    call_timeout: float = 120.0
    max_tokens: int = 4096
    #: server-side model endpoint used when the client sends no aiGatewayApiKey;
    #: the server key only ever goes to this URL, never to a client-chosen one.
    base_url: str = ""
    api_key: Secret = ""


@dataclass(frozen=True, slots=True)
class ToolbridgeConfig:
    """``xwm-bridge toolbridge`` (MCP over stdio); env names as in config.md §2.3."""

    llm_api_key: Secret = ""
    llm_base_url: str = "https://api.openai.com/v1"
    llm_model: str = "gpt-4o"
    chat_timeout: float = 120.0
    claude_bin: str = "claude"
    claude_review_model: str = ""
    claude_review_system: str = ""
    claude_review_tools: str = ""
    claude_review_timeout: float = 600.0
    claude_output_max_bytes: int = 4 * MIB
    vault_url: str = ""
    vault_token: Secret = ""
    vault_namespace: str = ""
    vault_timeout: float = 30.0
    #: ``mount/path`` prefixes vault_kv may touch; empty = any path.
    vault_allowed_paths: tuple[str, ...] = ()
    #: tool calls running at once; further requests wait (stdin is not read meanwhile).
    max_concurrent_calls: int = 8


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Routing classifier, memory and skill commands (routing.md; issue 3)."""

    #: the classifier endpoint used with ``llm_api_key`` (the server key never
    #: goes to a client-chosen URL).
    llm_base_url: str = "https://api.openai.com/v1"
    llm_api_key: Secret = ""
    classifier_timeout: float = 10.0
    classifier_cache_ttl: float = 300.0
    classifier_cache_entries: int = 1024
    classifier_max_concurrency: int = 4
    #: hosts (any port) or ``host:port`` a client's own ``aiGatewayBaseUrl`` may name for
    #: the classifier; ``*`` = any. Empty = loopback plus the configured endpoints.
    classifier_allowed_hosts: tuple[str, ...] = ()
    memory_enabled: bool = True
    #: directory holding ``self-improving/``; empty = ``$HOME``.
    memory_home: str = ""
    #: absolute roots under which ``<workingDirectory>/.xworkmate/memory.md`` may be used;
    #: unset (``None``) = ``allowed_roots``; ``[]`` = nowhere.
    memory_project_roots: tuple[str, ...] | None = None
    memory_max_bytes: int = 256 * 1024
    skill_commands_enabled: bool = False
    find_skills_bin: str = ""
    install_skill_bin: str = ""
    skill_command_timeout: float = 45.0
    skill_command_max_output: int = 1 * MIB


@dataclass(frozen=True, slots=True)
class MountsConfig:
    """``xworkmate.mounts.reconcile`` (adapters.md §4; issue 3)."""

    #: tool homes; empty = ``$HOME/.codex`` etc. Client-sent homes are used only
    #: when they are one of these or inside one.
    codex_home: str = ""
    opencode_home: str = ""
    openclaw_home: str = ""
    #: run ``claude mcp list`` / ``gemini mcp list`` for discovery.
    cli_discovery_enabled: bool = False
    cli_timeout: float = 4.0


@dataclass(frozen=True, slots=True)
class PermissionRule:
    """One rule of the stdio-agent permission policy (first match wins)."""

    action: str = "ask"
    kind: str = "*"
    path: str = "*"
    #: the rule only applies to turns whose client cannot receive notifications
    #: (plain-JSON HTTP): e.g. ``{action: reject, streamless: true}`` keeps rejecting
    #: there instead of waiting for an answer from another client or the console.
    streamless: bool = False


@dataclass(frozen=True, slots=True)
class AgentsConfig:
    """Local stdio ACP agents: deadlines, client-side tools, permission policy."""

    initialize_timeout: float = 60.0
    session_timeout: float = 60.0
    #: hard cap on one ``session/prompt``.
    prompt_timeout: float = 600.0
    #: an ``ask`` nobody answers within this is rejected.
    permission_timeout: float = 120.0
    permission_rules: tuple[PermissionRule, ...] = ()
    permission_rules_file: str = ""
    #: serve ``fs/read_text_file`` and ``fs/write_text_file`` (inside allowed roots only).
    fs_enabled: bool = True
    fs_max_file_bytes: int = 8 * MIB
    #: serve ``terminal/*`` (commands run in the session directory, no shell).
    terminal_enabled: bool = False
    terminal_output_limit: int = MIB
    terminal_max_running: int = 4
    #: SIGTERM → SIGKILL delay when stopping an agent's process group.
    stop_grace: float = 3.0
    #: make the known agents (providers/stdio/registry.py) found on PATH providers.
    detect: bool = True
    #: registry ids never detected.
    detect_skip: tuple[str, ...] = ()
    #: directories searched for agent executables before PATH.
    search_paths: tuple[str, ...] = ()
    #: ``none`` or ``bwrap`` (write access only to the session directory, the
    #: agent's state dirs and a private /tmp).
    sandbox: str = "none"
    bwrap_path: str = "bwrap"
    #: sandboxed agent processes kept at once (one per provider and directory).
    max_sandboxed_processes: int = 8
    #: deadline of ``doctor``'s ``initialize`` of each stdio agent.
    probe_timeout: float = 15.0
    #: ``NAME=value`` items given to the toolbridge MCP server (the agent sees them).
    toolbridge_env: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """OpenClaw gateway runtimes (gateway.md): deadlines, reconnect, ownership."""

    connect_timeout: float = 10.0
    challenge_timeout: float = 2.0
    hello_timeout: float = 12.0
    request_timeout: float = 15.0
    #: a gateway-mode turn that has not finished by then is aborted upstream.
    turn_timeout: float = 120.0
    abort_timeout: float = 5.0
    #: a runtime with no request and no live owner WebSocket for this long is closed.
    idle_ttl: float = 1800.0
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    notify_timeout: float = 5.0
    max_runtimes_per_principal: int = 16
    max_message_bytes: int = 16 * MIB
    #: send the caller's own bearer to a ``local`` gateway that got no token.
    forward_client_bearer: bool = False
    #: hosts (any port) or ``host:port`` a ``local`` runtime may dial; ``*`` = any.
    #: Empty = loopback (any port) plus the endpoints configured in this file.
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Session persistence (issue 6): where sessions and their ledgers survive restarts."""

    #: ``sqlite`` (a file under ``state_dir``), ``redis`` (shared by replicas) or
    #: ``memory`` (nothing survives a restart).
    backend: str = "sqlite"
    #: directory of the SQLite file; empty = ``$XDG_STATE_HOME/xwm-bridge``,
    #: ``~/.local/state/xwm-bridge`` or ``./state``.
    state_dir: str = ""
    #: notifications kept per session for ``session.replay``.
    ledger_max_entries: int = 512
    #: encoded bytes of notifications kept per session (the newest that fit).
    ledger_max_bytes: int = 8 * MIB
    #: bytes of prompt history kept per session (oldest prompts go first; the
    #: latest is always kept).
    history_max_bytes: int = MIB
    #: backend ``memory``: every session together; the oldest entries go first.
    memory_max_bytes: int = 256 * MIB
    #: seconds a ledger entry is kept.
    ledger_max_age: float = 3600.0
    #: seconds an untouched session is kept in the store.
    retention: float = 7 * 86400.0
    #: most notifications one ``session.replay`` returns.
    replay_max_items: int = 1000
    #: ``redis://[:password@]host:port/db`` of the shared store (backend ``redis``).
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "xwm:"
    #: deadline of every Redis command.
    redis_timeout: float = 5.0
    #: seconds after which a dead replica's liveness and thread leases expire.
    lease_ttl: float = 10.0


STORE_BACKENDS = ("sqlite", "redis", "memory")


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """The operator console (``GET /console``) and the ``bridge.watch`` event log."""

    #: serve ``/console`` (the methods behind it are always there).
    enabled: bool = True
    #: events the log keeps for watchers that reconnect with ``since``.
    event_buffer: int = 4096
    #: events one watcher may fall behind before its watch ends (it re-watches).
    watch_max_pending: int = 2048
    #: seconds between health and metrics samples.
    health_interval: float = 2.0


@dataclass(frozen=True, slots=True)
class AcpConfig:
    """The ACP front door (``xwm-bridge acp`` and ``serve``'s ``/acp/remote``)."""

    #: route of a new ACP session: ``auto``, ``single-agent:<provider id>``,
    #: ``multi-agent`` or ``gateway:<local|openclaw>``.
    default_route: str = "auto"
    #: remote transport: open ACP connections at most (all clients together).
    max_connections: int = 256
    #: remote transport: a Streamable HTTP connection with no open stream and no
    #: request for this long is closed (its running turns go on).
    connection_idle_ttl: float = 600.0
    #: messages buffered for a stream that is not open (yet); past that the
    #: connection is closed as broken.
    stream_buffer: int = 4096
    #: sessions one ``session/list`` page holds.
    list_page_size: int = 50


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    listen: str = DEFAULT_LISTEN
    auth_token: Secret = ""
    #: further accepted client bearer tokens; each one is its own principal (gateway
    #: runtimes, sessions).
    client_tokens: tuple[Secret, ...] = ()
    #: accepted bearer tokens that may also see and act on every principal's sessions
    #: (the operator console).
    admin_tokens: tuple[Secret, ...] = ()
    allow_unauthenticated: bool = False
    allowed_origins: tuple[str, ...] = DEFAULT_ALLOWED_ORIGINS
    internal_service_token: Secret = ""
    bridge_auth_token: Secret = ""
    multi_agent_enabled: bool = True
    multi_agent_model: str = "gpt-4o"
    routing_model: str = "gpt-4o"
    image: str = ""
    public_base_url: str = "https://xworkmate-bridge.svc.plus"
    accounts_base_url: str = "https://accounts.svc.plus"
    openclaw_url: str = "wss://openclaw.svc.plus:443"
    #: token for the ``openclaw`` gateway; empty = bare INTERNAL_SERVICE_TOKEN/BRIDGE_AUTH_TOKEN.
    openclaw_token: Secret = ""
    #: directories whose files may be read (artifacts); empty = none.
    allowed_roots: tuple[str, ...] = ()
    log_level: str = "info"
    #: ``auto`` (text on a terminal, else JSON), ``json`` or ``text``
    log_format: str = "auto"
    #: /readyz also requires every enabled provider to accept a TCP connection.
    ready_requires_providers: bool = False
    limits: Limits = field(default_factory=Limits)
    multi_agent: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    toolbridge: ToolbridgeConfig = field(default_factory=ToolbridgeConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    mounts: MountsConfig = field(default_factory=MountsConfig)
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    acp: AcpConfig = field(default_factory=AcpConfig)
    providers: tuple[ProviderConfig, ...] = DEFAULT_PROVIDERS

    @property
    def upstream_authorization(self) -> str:
        """Normalized outbound ``Authorization`` (forwarding.md §2)."""
        token = self.internal_service_token or self.bridge_auth_token
        if not token:
            return ""
        return token if " " in token else f"Bearer {token}"

    def provider_authorization(self, provider: ProviderConfig) -> str:
        if provider.auth_header is not None:
            return provider.auth_header
        return self.upstream_authorization

    @property
    def memory_roots(self) -> tuple[str, ...]:
        """Where project-local routing memory may be read and written."""
        roots = self.router.memory_project_roots
        return self.allowed_roots if roots is None else roots

    @property
    def available_providers(self) -> tuple[ProviderConfig, ...]:
        return tuple(p for p in self.providers if p.available)

    def configured_endpoints(self) -> tuple[str, ...]:
        """``host:port`` of every URL in the config (providers, gateway, LLM bases…):
        with loopback, where client-chosen destinations may go by default."""
        urls = [
            getattr(owner, name)
            for owner, name, _ in _fields(self)
            if isinstance(getattr(owner, name), str) and "://" in getattr(owner, name)
        ]
        return tuple(dict.fromkeys(e for e in map(endpoint_of, urls) if e))

    @property
    def authenticates(self) -> bool:
        """Clients must present one of the configured tokens."""
        return bool(self.auth_token or self.client_tokens or self.admin_tokens)

    def own_secrets(self) -> tuple[str, ...]:
        """The bridge's own credentials (never given to a local agent's environment)."""
        values = [
            self.auth_token,
            self.internal_service_token,
            self.bridge_auth_token,
            self.openclaw_token,
            *self.client_tokens,
            *self.admin_tokens,
            self.router.llm_api_key,
            self.multi_agent.api_key,
            self.toolbridge.llm_api_key,
            self.toolbridge.vault_token,
            urlsplit(self.store.redis_url).password or "",
        ]
        values += [p.auth_header or "" for p in self.providers]
        out: list[str] = []
        for value in values:
            out.append(value)
            if " " in value:  # also the bare credential of "Bearer x"
                out.append(value.split(" ", 1)[1].strip())
        return tuple(v for v in out if len(v) >= 4)

    def secrets(self) -> tuple[str, ...]:
        """Every configured secret value, for log redaction: :meth:`credentials`, and
        also every other ``env`` / MCP header value from 4 characters (an agent's
        environment often holds keys under any name)."""
        values = list(self.credentials())
        values += [v for k, v in self._named_values() if len(v) >= 4]
        return _with_bare(values)

    def credentials(self) -> tuple[str, ...]:
        """The values that are credentials for sure, whatever their length: each
        ``Secret``-typed field, the password of any URL, and ``env`` (providers, MCP
        servers, ``agents.toolbridge_env``) and MCP header values whose name says
        key, token, secret, password, credential, cookie or authorization. Masked in
        every message to a client (wire.py) as in the logs; the wider :meth:`secrets`
        would also mask plain values such as ``http`` in replies."""
        values: list[str] = []
        for owner, name, hint in _fields(self):
            value = getattr(owner, name)
            if _is_secret(hint):
                values += list(value) if isinstance(value, tuple) else [value or ""]
            elif isinstance(value, str) and "://" in value:
                values.append(url_password(value))
        values += [v for k, v in self._named_values() if _SECRET_NAME.search(k)]
        return _with_bare(values)

    def _named_values(self) -> list[tuple[str, str]]:
        pairs = [item.partition("=")[::2] for p in self.providers for item in p.env]
        pairs += [item.partition("=")[::2] for item in self.agents.toolbridge_env]
        for p in self.providers:
            for m in p.mcp_servers:
                pairs += [item.partition("=")[::2] for item in m.env]
                pairs += [(k, v.strip()) for k, _, v in (h.partition(":") for h in m.headers)]
        return [(k, v) for k, v in pairs if v]


def _with_bare(values: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        out.append(value)
        if " " in value.strip():  # also the bare credential of "Bearer x"
            out.append(value.strip().split(" ", 1)[1].strip())
    return tuple(dict.fromkeys(v for v in out if v))


#: a variable or header name that says its value is a credential
_SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|COOKIE|AUTHORIZATION", re.IGNORECASE
)


def url_password(value: str) -> str:
    try:
        return urlsplit(value.strip()).password or ""
    except ValueError:
        return ""


def _is_secret(hint: Any) -> bool:
    """``Secret``, ``Secret | None`` or ``tuple[Secret, ...]``."""
    if get_origin(hint) is Annotated:
        return SECRET_MARK in hint.__metadata__
    return any(_is_secret(arg) for arg in get_args(hint) if arg is not Ellipsis)


def _fields(obj: Any) -> list[tuple[Any, str, Any]]:
    """(dataclass, field name, annotated type) of every field, nested sections and
    providers included."""
    out: list[tuple[Any, str, Any]] = []
    hints = get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _fields(value)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                out += _fields(item)
        else:
            out.append((obj, f.name, hints[f.name]))
    return out


def secret_field(obj: Any, name: str) -> bool:
    """Whether ``name`` of the config dataclass ``obj`` holds a credential."""
    return _is_secret(get_type_hints(type(obj), include_extras=True)[name])


# --- environment mapping (config.md §2.1) ------------------------------------------------

ENV_VARS: dict[str, str] = {
    "listen": "ACP_LISTEN_ADDR",
    "auth_token": "ACP_AUTH_TOKEN",
    "client_tokens": "XWM_CLIENT_TOKENS",
    "admin_tokens": "XWM_ADMIN_TOKENS",
    "allowed_origins": "ACP_ALLOWED_ORIGINS",
    "internal_service_token": "INTERNAL_SERVICE_TOKEN",
    "bridge_auth_token": "BRIDGE_AUTH_TOKEN",
    "multi_agent_enabled": "ACP_MULTI_AGENT_ENABLED",
    "multi_agent_model": "ACP_MULTI_AGENT_MODEL",
    "routing_model": "ACP_ROUTING_MODEL",
    "image": "IMAGE",
    "public_base_url": "BRIDGE_PUBLIC_BASE_URL",
    "accounts_base_url": "ACCOUNTS_BASE_URL",
    "openclaw_url": "XWM_OPENCLAW_URL",
    "openclaw_token": "XWM_OPENCLAW_TOKEN",
    "allowed_roots": "XWM_ALLOWED_ROOTS",
    "log_level": "XWM_LOG_LEVEL",
    "log_format": "XWM_LOG_FORMAT",
}
#: nested keys set from the environment (config.md §2.3 for the toolbridge)
NESTED_ENV_VARS: dict[str, str] = {
    "toolbridge.llm_api_key": "LLM_API_KEY",
    "toolbridge.llm_base_url": "LLM_BASE_URL",
    "toolbridge.llm_model": "LLM_MODEL",
    "toolbridge.claude_bin": "CLAUDE_BIN",
    "toolbridge.claude_review_model": "CLAUDE_REVIEW_MODEL",
    "toolbridge.claude_review_system": "CLAUDE_REVIEW_SYSTEM",
    "toolbridge.claude_review_tools": "CLAUDE_REVIEW_TOOLS",
    "toolbridge.claude_review_timeout": "CLAUDE_REVIEW_TIMEOUT_SEC",
    "toolbridge.vault_url": "VAULT_SERVER_URL",
    "toolbridge.vault_token": "VAULT_SERVER_ROOT_ACCESS_TOKEN",
    "toolbridge.vault_namespace": "VAULT_NAMESPACE",
    "multi_agent.max_iterations": "XWM_MULTI_AGENT_MAX_ITERATIONS",
    "multi_agent.base_url": "XWM_MULTI_AGENT_BASE_URL",
    "multi_agent.api_key": "XWM_MULTI_AGENT_API_KEY",
    "router.llm_base_url": "LLM_BASE_URL",
    "router.llm_api_key": "LLM_API_KEY",
    "router.find_skills_bin": "ACP_FIND_SKILLS_BIN",
    "router.install_skill_bin": "ACP_INSTALL_SKILL_BIN",
    "store.backend": "XWM_SESSION_STORE",
    "store.state_dir": "XWM_STATE_DIR",
    "store.redis_url": "XWM_REDIS_URL",
    "acp.default_route": "XWM_ACP_DEFAULT_ROUTE",
    "agents.detect": "XWM_AGENTS_DETECT",
    "agents.search_paths": "XWM_AGENTS_PATH",
    "agents.sandbox": "XWM_AGENTS_SANDBOX",
}
#: the bridge's own secrets: never copied into an agent's environment
SECRET_ENV_VARS = frozenset(
    {
        "ACP_AUTH_TOKEN",
        "XWM_CLIENT_TOKENS",
        "INTERNAL_SERVICE_TOKEN",
        "BRIDGE_AUTH_TOKEN",
        "XWM_OPENCLAW_TOKEN",
        "LLM_API_KEY",
        "XWM_MULTI_AGENT_API_KEY",
        "VAULT_SERVER_ROOT_ACCESS_TOKEN",
        "XWM_REDIS_URL",
        "GEMINI_ADAPTER_AUTH_TOKEN",
    }
)
CONFIG_FILE_ENV = "XWM_BRIDGE_CONFIG"
_LIST_SEPARATORS = {
    "allowed_origins": ",",
    "allowed_roots": ":",
    "client_tokens": ",",
    "admin_tokens": ",",
    "agents.search_paths": ":",
}
_ENV_FLAGS = {
    f.name: f.default
    for f in dataclasses.fields(BridgeConfig)
    if f.type in (bool, "bool") and isinstance(f.default, bool)
}
_INTERP = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "text")


def provider_env_var(provider_id: str) -> str:
    return "XWM_PROVIDER_" + re.sub(r"[^A-Za-z0-9]", "_", provider_id).upper() + "_URL"


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: BridgeConfig
    #: dotted key → where its value came from ("default", "file", "env:NAME", "flag").
    sources: Mapping[str, str]


def load_config(
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Build the effective config; raise :class:`ConfigError` on any bad value."""
    env = dict(os.environ if env is None else env)
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    sources: dict[str, str] = {}
    data: dict[str, Any] = {}

    path = config_file or coerce.env_text(env, CONFIG_FILE_ENV)
    if path:
        data = _read_yaml(Path(path), env)
        for key in data:
            sources[key] = "file"

    for key, var in ENV_VARS.items():
        value = coerce.env_text(env, var)
        if not value:
            continue
        sep = _LIST_SEPARATORS.get(key)
        if sep is not None:
            data[key] = [v.strip() for v in value.split(sep) if v.strip()]
        elif key in _ENV_FLAGS:
            # the spec's **flag** rule: an unrecognized word means the default
            data[key] = coerce.flag(value, _ENV_FLAGS[key])
        else:
            data[key] = value
        sources[key] = f"env:{var}"

    for dotted, var in NESTED_ENV_VARS.items():
        value = coerce.env_text(env, var)
        if not value:
            continue
        section, name = dotted.split(".", 1)
        current = data.get(section)
        if not isinstance(current, dict):
            current = {} if current is None else current
            data[section] = current
        if isinstance(current, dict):
            current[name] = value
        sources[dotted] = f"env:{var}"

    for key, value in flags.items():
        data[key] = value
        sources[key] = "flag"

    config = _build(BridgeConfig, data, "")
    config = _apply_provider_env(config, env, sources)
    _validate(config)
    for f in dataclasses.fields(BridgeConfig):
        sources.setdefault(f.name, "default")
    return LoadedConfig(config=config, sources=sources)


def _read_yaml(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path}: {problem}{where}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    result = _interpolate(doc, env, "")
    assert isinstance(result, dict)
    return result


def _interpolate(value: Any, env: Mapping[str, str], key: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            # config.md §2: values are trimmed and a blank one counts as unset,
            # so ${VAR:-default} falls back for VAR="" just as the shell does.
            current = coerce.env_text(env, name)
            if current:
                return current
            if default is not None:
                return default
            raise ConfigError(f"{key}: environment variable {name} is not set")

        return _INTERP.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, env, _join(key, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _build(cls: type[Any], data: Any, key: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{key or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(map(str, data)) - names)
    if unknown:
        raise ConfigError(f"{_join(key, unknown[0])}: unknown key")
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in data:
            raise ConfigError(f"{_join(key, f.name)}: required key is missing")
    kwargs = {name: _convert(hints[name], data[name], _join(key, name)) for name in data}
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(f"{key or 'config'}: {exc}") from None


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key)  # type: ignore[arg-type]
    if origin is tuple:
        (item_tp, _) = get_args(tp)
        if isinstance(value, str):
            sep = _LIST_SEPARATORS.get(key, ",")
            value = [v.strip() for v in value.split(sep) if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(_convert(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if isinstance(value, bool):
            return value
        word = coerce.text(value).lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int or tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if tp is int and isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            number = tp(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if number != number:  # NaN
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if number < 0:
            raise ConfigError(f"{key}: must not be negative, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__}")
        return "" if value is None else str(value).strip()
    raise ConfigError(f"{key}: unsupported type")  # pragma: no cover - schema bug


def _apply_provider_env(
    config: BridgeConfig, env: Mapping[str, str], sources: dict[str, str]
) -> BridgeConfig:
    providers = []
    for i, p in enumerate(config.providers):
        var = provider_env_var(p.id)
        url = coerce.env_text(env, var)
        if url:
            p = dataclasses.replace(p, endpoint=url)
            sources[f"providers[{i}].endpoint"] = f"env:{var}"
        providers.append(p)
    return dataclasses.replace(config, providers=tuple(providers))


def _validate_agent_fields(p: ProviderConfig, key: str) -> None:
    """The stdio-agent keys of one provider."""
    for j, name in enumerate(p.pass_env):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", name):
            raise ConfigError(f"{key}.pass_env[{j}]: expected a variable name or PREFIX_*")
        if name in SECRET_ENV_VARS or (
            name.endswith("*") and any(s.startswith(name[:-1]) for s in SECRET_ENV_VARS)
        ):
            raise ConfigError(
                f"{key}.pass_env[{j}]: {name} would copy a bridge secret into the agent; "
                "set the value explicitly in env if the agent really needs it"
            )
    for j, item in enumerate(p.options):
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ConfigError(f"{key}.options[{j}]: expected configId=value")
    seen: set[str] = set()
    for j, m in enumerate(p.mcp_servers):
        where = f"{key}.mcp_servers[{j}]"
        if not m.name.strip():
            raise ConfigError(f"{where}.name: must not be empty")
        if m.name in seen:
            raise ConfigError(f"{where}.name: duplicate MCP server name {m.name!r}")
        seen.add(m.name)
        if m.type not in MCP_TYPES:
            raise ConfigError(f"{where}.type: must be one of {', '.join(MCP_TYPES)}")
        if m.type == "stdio" and not m.command:
            raise ConfigError(f"{where}.command: required for a stdio MCP server")
        if m.type != "stdio" and urlsplit(m.url).scheme not in ("http", "https"):
            raise ConfigError(f"{where}.url: an http(s) URL is required for type {m.type}")
        for item in m.env:
            if "=" not in item or not item.split("=", 1)[0]:
                raise ConfigError(f"{where}.env: expected NAME=value, got {item!r}")
        for item in m.headers:
            if ":" not in item or not item.split(":", 1)[0].strip():
                raise ConfigError(f"{where}.headers: expected 'Name: value', got {item!r}")
    for j, path in enumerate(p.writable_paths):
        if not os.path.isabs(path):
            raise ConfigError(f"{key}.writable_paths[{j}]: must be an absolute path")


def _validate(config: BridgeConfig) -> None:
    try:
        parse_listen(config.listen)
    except ValueError as exc:
        raise ConfigError(f"listen: {exc}") from None
    for key in ("client_tokens", "admin_tokens"):
        for i, token in enumerate(getattr(config, key)):
            if not token.strip():  # a blank token would switch authentication off
                raise ConfigError(f"{key}[{i}]: must not be blank")
    if config.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(f"log_level: must be one of {', '.join(LOG_LEVELS)}")
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format: must be one of {', '.join(LOG_FORMATS)}")
    seen: set[str] = set()
    for i, p in enumerate(config.providers):
        key = f"providers[{i}]"
        if not p.id.strip():
            raise ConfigError(f"{key}.id: must not be empty")
        if p.id.lower() in seen:
            raise ConfigError(f"{key}.id: duplicate provider id {p.id!r}")
        seen.add(p.id.lower())
        if p.kind not in ("http", "stdio"):
            raise ConfigError(f"{key}.kind: must be http or stdio, got {p.kind!r}")
        for j, item in enumerate(p.env):
            if "=" not in item or not item.split("=", 1)[0]:
                raise ConfigError(f"{key}.env[{j}]: expected NAME=value")
        if p.available and not p.is_stdio:
            try:
                derive_endpoint(p.endpoint)
            except EndpointError as exc:
                raise ConfigError(f"{key}.endpoint: {exc}") from None
        for name in ("connect_timeout", "read_timeout", "total_timeout"):
            if getattr(p, name) <= 0:
                raise ConfigError(f"{key}.{name}: must be greater than 0")
        _validate_agent_fields(p, key)
    for i, root in enumerate(config.allowed_roots):
        if not os.path.isabs(root):
            raise ConfigError(f"allowed_roots[{i}]: must be an absolute path, got {root!r}")
    ma, tb = config.multi_agent, config.toolbridge
    if not 1 <= ma.max_iterations <= 20:
        raise ConfigError("multi_agent.max_iterations: must be between 1 and 20")
    if not 1 <= ma.workers <= 8:
        raise ConfigError("multi_agent.workers: must be between 1 and 8")
    if ma.score_threshold > 10:
        raise ConfigError("multi_agent.score_threshold: must be between 0 and 10")
    for key, value in (
        ("multi_agent.call_timeout", ma.call_timeout),
        ("multi_agent.max_tokens", ma.max_tokens),
        ("toolbridge.chat_timeout", tb.chat_timeout),
        ("toolbridge.claude_review_timeout", tb.claude_review_timeout),
        ("toolbridge.claude_output_max_bytes", tb.claude_output_max_bytes),
        ("toolbridge.vault_timeout", tb.vault_timeout),
        ("toolbridge.max_concurrent_calls", tb.max_concurrent_calls),
    ):
        if value <= 0:
            raise ConfigError(f"{key}: must be greater than 0")
    for i, root in enumerate(config.router.memory_project_roots or ()):
        if not os.path.isabs(root):
            raise ConfigError(f"router.memory_project_roots[{i}]: must be an absolute path")
    if config.router.classifier_timeout <= 0 or config.router.skill_command_timeout <= 0:
        raise ConfigError("router: timeouts must be greater than 0")
    if config.router.classifier_max_concurrency <= 0:
        raise ConfigError("router.classifier_max_concurrency: must be greater than 0")
    for name in ("initialize_timeout", "session_timeout", "prompt_timeout", "permission_timeout"):
        if getattr(config.agents, name) <= 0:
            raise ConfigError(f"agents.{name}: must be greater than 0")
    for i, rule in enumerate(config.agents.permission_rules):
        if rule.action not in ("allow", "reject", "ask"):
            raise ConfigError(
                f"agents.permission_rules[{i}].action: must be one of allow, reject, ask"
            )
    ag = config.agents
    if ag.sandbox not in SANDBOXES:
        raise ConfigError(f"agents.sandbox: must be one of {', '.join(SANDBOXES)}")
    if ag.probe_timeout <= 0 or ag.max_sandboxed_processes < 1:
        raise ConfigError("agents: probe_timeout and max_sandboxed_processes must be > 0")
    for i, d in enumerate(ag.search_paths):
        if not os.path.isabs(d):
            raise ConfigError(f"agents.search_paths[{i}]: must be an absolute path, got {d!r}")
    for j, item in enumerate(ag.toolbridge_env):
        if "=" not in item or not item.split("=", 1)[0]:
            raise ConfigError(f"agents.toolbridge_env[{j}]: expected NAME=value")
    gw = config.gateway
    for name in (
        "connect_timeout",
        "challenge_timeout",
        "hello_timeout",
        "request_timeout",
        "turn_timeout",
        "abort_timeout",
        "idle_ttl",
        "backoff_initial",
        "backoff_max",
        "notify_timeout",
        "max_message_bytes",
    ):
        if getattr(gw, name) <= 0:
            raise ConfigError(f"gateway.{name}: must be greater than 0")
    if gw.backoff_max < gw.backoff_initial:
        raise ConfigError("gateway.backoff_max: must not be less than gateway.backoff_initial")
    if config.store.backend not in STORE_BACKENDS:
        raise ConfigError(f"store.backend: must be one of {', '.join(STORE_BACKENDS)}")
    if config.store.ledger_max_entries <= 0 or config.store.replay_max_items <= 0:
        raise ConfigError("store: ledger_max_entries and replay_max_items must be greater than 0")
    for name in ("ledger_max_bytes", "history_max_bytes", "memory_max_bytes"):
        if getattr(config.store, name) <= 0:
            raise ConfigError(f"store.{name}: must be greater than 0")
    if config.store.ledger_max_age <= 0 or config.store.retention <= 0:
        raise ConfigError("store: ledger_max_age and retention must be greater than 0")
    if config.store.redis_timeout <= 0 or config.store.lease_ttl < 1:
        raise ConfigError("store: redis_timeout must be > 0 and lease_ttl at least 1 second")
    cc = config.console
    if cc.event_buffer < 16 or cc.watch_max_pending < 16:
        raise ConfigError("console: event_buffer and watch_max_pending must be at least 16")
    if cc.health_interval < 0.1:
        raise ConfigError("console.health_interval: must be at least 0.1 seconds")
    if config.limits.max_body_bytes <= 0 or config.limits.max_ws_message_bytes <= 0:
        raise ConfigError("limits: size limits must be greater than 0")
    _validate_acp(config)


def _validate_acp(config: BridgeConfig) -> None:
    acp = config.acp
    route = acp.default_route
    kind, _, target = route.partition(":")
    ids = {p.id.lower() for p in config.providers}
    ok = (
        route in ("auto", "multi-agent")
        or (kind == "single-agent" and target.lower() in ids)
        or (kind == "gateway" and target.lower() in ("local", "openclaw"))
    )
    if not ok:
        raise ConfigError(
            f"acp.default_route: {route!r} is not auto, multi-agent, "
            "single-agent:<a configured provider id> or gateway:<local|openclaw>"
        )
    for name in ("max_connections", "connection_idle_ttl", "stream_buffer", "list_page_size"):
        if getattr(acp, name) <= 0:
            raise ConfigError(f"acp.{name}: must be greater than 0")
