"""The nested sections of :class:`~xwm_bridge.config.model.BridgeConfig`: ``limits``,
``multi_agent``, ``toolbridge``, ``router``, ``mounts``, ``agents``, ``gateway``,
``store``, ``console`` and ``acp``."""

from __future__ import annotations

from dataclasses import dataclass

from xwm_bridge.config.secret_fields import Secret, masked

MIB = 1024 * 1024
SANDBOXES = ("none", "bwrap")


@masked
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
    #: a client that cannot take a notification within this is dropped from the stream;
    #: a connection whose writes stay paused this long is aborted.
    notification_send_timeout: float = 30.0
    ws_heartbeat: float = 30.0
    #: seconds between ``: keep-alive`` comments on a silent SSE stream (0 = off)
    sse_keepalive: float = 15.0
    artifact_max_files: int = 24
    artifact_max_file_bytes: int = 2 * MIB
    artifact_max_total_bytes: int = 16 * MIB
    upstream_cancel_timeout: float = 5.0
    #: a turn for the id of a session closed while its turn still ends waits at most
    #: this for that turn's end, then is refused (``-32004``).
    session_close_wait: float = 10.0
    bootstrap_requests_per_minute: int = 10
    bootstrap_timeout: float = 10.0
    shutdown_grace: float = 20.0


@masked
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
    #: hosts (any port) or ``host:port`` a client's own ``aiGatewayBaseUrl`` may name,
    #: ``*`` = any; empty = loopback plus the endpoints of this config
    allowed_hosts: tuple[str, ...] = ()


@masked
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
    #: tool calls running at once; up to 16 more requests wait (stdin is still read, so
    #: a cancel or a ping gets through), past that stdin is not read meanwhile.
    max_concurrent_calls: int = 8


@masked
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


@masked
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


@masked
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


@masked
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
    #: sandboxed agent processes kept at once (one per provider and directory); one
    #: with a call in flight is never closed to make room.
    max_sandboxed_processes: int = 8
    #: how long a call needing a new sandboxed process waits for one to become idle when
    #: all ``max_sandboxed_processes`` are busy (then it fails; 0 = fail at once).
    process_wait: float = 60.0
    #: deadline of ``doctor``'s ``initialize`` of each stdio agent.
    probe_timeout: float = 15.0
    #: ``NAME=value`` items given to the toolbridge MCP server (the agent sees them).
    toolbridge_env: tuple[str, ...] = ()


@masked
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
    #: runtimes of all principals together (a bridge without a token takes any bearer,
    #: and each new bearer is a new principal).
    max_runtimes: int = 64
    max_message_bytes: int = 16 * MIB
    #: send the caller's own bearer to a ``local`` gateway that got no token.
    forward_client_bearer: bool = False
    #: hosts (any port) or ``host:port`` a ``local`` runtime may dial; ``*`` = any.
    #: Empty = loopback (any port) plus the endpoints configured in this file.
    allowed_hosts: tuple[str, ...] = ()


@masked
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


@masked
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
    #: browser origins, besides the page's own, that may open ``/console/ws``
    #: (``scheme://host[:port]``, ``:*`` = any port); the bridge-wide
    #: ``allowed_origins`` do not apply to it.
    allowed_origins: tuple[str, ...] = ()


@masked
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
    #: tell the client with ``$/cancel_request`` when the bridge settles an open
    #: ``session/request_permission`` itself (turn cancel, deadline, console). Off by
    #: default: the official Python SDK's client (0.12) logs an error on it.
    cancel_requests: bool = False
