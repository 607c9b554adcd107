"""The top-level :class:`BridgeConfig`, its providers and their MCP servers, and
:class:`ConfigError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from xwm_bridge.config.secret_fields import (
    _SECRET_NAME,
    ARGV_FIELDS,
    Secret,
    _fields,
    _is_secret,
    _with_bare,
    flag_secrets,
    masked,
    url_password,
    url_query_secrets,
)
from xwm_bridge.config.sections import (
    AcpConfig,
    AgentsConfig,
    ConsoleConfig,
    GatewayConfig,
    Limits,
    MountsConfig,
    MultiAgentConfig,
    RouterConfig,
    StoreConfig,
    ToolbridgeConfig,
)
from xwm_bridge.netaddr import endpoint_of

DEFAULT_LISTEN = "127.0.0.1:8787"
DEFAULT_ALLOWED_ORIGINS = (
    "https://xworkmate.svc.plus",
    "http://localhost:*",
    "http://127.0.0.1:*",
)
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "text")


class ConfigError(Exception):
    """A configuration problem, phrased as one line naming the key."""


MCP_TYPES = ("stdio", "http", "sse")


@masked
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


@masked
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


@masked
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
    #: ``Host`` names a bridge without a token answers besides loopback, IP literals
    #: and the listen host (DNS rebinding, transport/security.py ``ServedHosts``);
    #: ``*`` = any.
    allowed_hosts: tuple[str, ...] = ()
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
        ``Secret``-typed field, the password of any URL, and the values whose name
        says key, token, secret, password, credential, cookie or authorization: of
        ``env`` items (providers, MCP servers, ``agents.toolbridge_env``), of MCP
        headers, of URL query parameters (``?api_key=…``) and of flags in an argv
        (a stdio agent's ``command``, an MCP server's ``args``: ``--api-key X``,
        ``--token=X``). Masked in
        every message to a client (wire.py) as in the logs; the wider :meth:`secrets`
        would also mask plain values such as ``http`` in replies."""
        values: list[str] = []
        for owner, name, hint in _fields(self):
            value = getattr(owner, name)
            if _is_secret(hint):
                values += list(value) if isinstance(value, tuple) else [value or ""]
            elif isinstance(value, str) and "://" in value:
                values += [url_password(value), *url_query_secrets(value)]
            elif name in ARGV_FIELDS and isinstance(value, tuple):
                values += flag_secrets(value)
                values += [s for arg in value if "://" in arg for s in url_query_secrets(arg)]
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
