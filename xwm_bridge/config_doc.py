"""Generates docs/architecture/configuration.md from the config schema.

``python -m xwm_bridge.config_doc > docs/architecture/configuration.md``; a test
fails when the committed file drifts from the schema or a key lacks a description.
"""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

from xwm_bridge.config import (
    CONFIG_FILE_ENV,
    DEFAULT_PROVIDERS,
    ENV_VARS,
    NESTED_ENV_VARS,
    BridgeConfig,
    Limits,
    ProviderConfig,
    provider_env_var,
)
from xwm_bridge.config.env_vars import BOOL_ENV_VARS

#: nested config sections (``limits``, ``router``, …) → their dataclass, in schema order
NESTED_SECTIONS: dict[str, type[Any]] = {
    f.name: hint
    for f in dataclasses.fields(BridgeConfig)
    if dataclasses.is_dataclass(hint := get_type_hints(BridgeConfig)[f.name])
    and isinstance(hint, type)
}

DESCRIPTIONS: dict[str, str] = {
    "listen": "HOST:PORT to listen on (`serve`; an IPv6 host in brackets, `[::1]:8787`; "
    "an empty host, `:8787`, is every interface); port 0 picks a free port; a malformed "
    "host is a config error at start",
    "auth_token": "bearer token clients must present; empty = any non-empty bearer (loopback only)",
    "client_tokens": "more accepted client bearer tokens (comma-separated in env); each is its own principal: it owns its gateway runtimes and sessions; a blank entry is a config error",
    "admin_tokens": "accepted bearer tokens that may also replay, follow, message, cancel and close every principal's sessions (the operator console); a blank entry is a config error",
    "allow_unauthenticated": "allow a non-loopback listen address without `auth_token`",
    "allowed_origins": "browser origins allowed on `/acp/rpc` and `/acp` (not `/console/ws`: `console.allowed_origins`); `scheme://host[:port]`, `scheme://host:*` = any port; an entry without a scheme and a host (`localhost:3000`, `*`) is a config error",
    "allowed_hosts": "with no token configured (loopback, or `allow_unauthenticated`), further `Host` names the bridge answers (any port; names as written, never resolved); loopback addresses, `localhost`, `*.localhost`, IP literals and the listen host always pass; any other `Host` gets `421` (DNS rebinding); `*` = any. Ignored when a token is required",
    "internal_service_token": "upstream `Authorization` (normalized to `Bearer …`); accounts `X-Service-Token`",
    "bridge_auth_token": "fallback upstream `Authorization` when `internal_service_token` is empty",
    "multi_agent_enabled": "advertise `multiAgent` in `acp.capabilities` (multi-agent turns run either way)",
    "multi_agent_model": "model for multi-agent turns when the request and the router name none",
    "routing_model": "model for the LLM routing classifier",
    "image": "container image reference reported by `/api/ping`",
    "public_base_url": "this bridge's public URL (bootstrap `bridgeOrigin`, the only accepted `bridge`)",
    "accounts_base_url": "accounts service for `/bridge/bootstrap/consume`",
    "openclaw_url": "endpoint dialed for `gatewayProviderId: openclaw` runtimes (`ws(s)://host[:port][/path]`; empty: none, an `openclaw` connect answers `INVALID_ENDPOINT`; anything else is a config error)",
    "openclaw_token": "token sent to the `openclaw` gateway; empty = bare `internal_service_token`/`bridge_auth_token`",
    "allowed_roots": "absolute directories the bridge itself reads and writes for clients and agents (artifacts, attachments, agents' `fs/*` and `terminal/*`); it does not confine what an agent does on its own (see `agents.sandbox`); empty = none",
    "log_level": "debug, info, warning or error",
    "log_format": "`json` (one object per line), `text` (human-readable, for a terminal) or `auto`: text when stderr is a terminal, else JSON",
    "ready_requires_providers": "`/readyz` answers 503 unless every enabled provider accepts a TCP connection",
    "limits.max_body_bytes": "largest HTTP request body (413 above) and stdio message",
    "limits.max_ws_message_bytes": "largest WebSocket message (close 1009 above)",
    "limits.max_queue_depth": "turns allowed to wait behind the running one on a thread (-32004 above)",
    "limits.session_idle_ttl": "seconds after which an idle session is forgotten",
    "limits.request_read_timeout": "seconds to receive a whole request body",
    "limits.header_read_timeout": "seconds a new connection has to send its first complete request head (then `408` and closed)",
    "limits.keepalive_timeout": "seconds an idle HTTP keep-alive connection stays open (also bounds a later request head on it); above nginx's 60 s",
    "limits.max_connections_per_address": "open connections per client IP, WebSockets and SSE streams included (one more: `503` and closed); behind a reverse proxy all clients share its IP: raise it or set 0 (no cap)",
    "limits.notification_send_timeout": "seconds a client may take to accept one message before it is dropped; also how long a connection's writes may stay paused (the client takes none of the bytes waiting for it) before the connection is aborted",
    "limits.ws_heartbeat": "seconds between WebSocket pings on client sockets (0 = off); a client that does not answer within half of it is dropped",
    "limits.sse_keepalive": "seconds between `: keep-alive` comment lines on a silent SSE stream (turns, catch-up), so proxies with idle timeouts do not cut long turns (0 = off)",
    "limits.artifact_max_files": "files returned as artifacts per result",
    "limits.artifact_max_file_bytes": "largest artifact file",
    "limits.artifact_max_total_bytes": "total artifact bytes per result",
    "limits.upstream_cancel_timeout": "seconds allowed for the `session.cancel` sent upstream",
    "limits.session_close_wait": "seconds a turn for the id of a session closed while its turn was still ending waits for that turn to end (then `-32004`, retry)",
    "limits.bootstrap_requests_per_minute": "bootstrap consume calls per client address per minute (0 = unlimited)",
    "limits.bootstrap_timeout": "seconds for the accounts service call",
    "limits.shutdown_grace": "seconds running turns may finish after SIGTERM before being cancelled",
    "store.backend": "session store: `sqlite` (file under `state_dir`, survives restarts), `redis` (shared by several replicas) or `memory`",
    "store.state_dir": "directory of `sessions.db`; empty = `$XDG_STATE_HOME/xwm-bridge`, else `~/.local/state/xwm-bridge`, else `./state`",
    "store.ledger_max_entries": "notifications kept per session for `session.replay` and the SSE catch-up stream",
    "store.ledger_max_bytes": "encoded bytes of notifications and results kept per session: the newest that fit, and always the newest one (oldest trimmed first)",
    "store.history_max_bytes": "bytes of prompt history kept per session (oldest prompts trimmed first; the latest always stays)",
    "store.memory_max_bytes": "backend `memory`: bytes of every session together (ledgers, histories, turn and permission records); past it the oldest ledger entries and turn records, then the least recently saved sessions (not one whose turn is running), go",
    "store.ledger_max_age": "seconds a ledger notification is kept",
    "store.retention": "seconds an untouched session stays in the store (idle sessions leave memory after `limits.session_idle_ttl` but can still be continued)",
    "store.replay_max_items": "most notifications one `session.replay` call returns",
    "store.redis_url": "Redis of the shared store (`redis://[:password@]host:port/db`, `rediss://…` or `unix:///path`; any other form is a config error at start; the password is redacted from logs)",
    "store.redis_prefix": "prefix of every Redis key the bridge uses (several bridges may share one Redis)",
    "store.redis_timeout": "seconds allowed for each Redis command (one attempt, no retries; a `redis_url`'s `socket_timeout` is ignored)",
    "store.lease_ttl": "seconds after which a dead replica's liveness key and thread leases expire (waiting turns then run elsewhere)",
    "acp.default_route": "route of a new ACP session (`xwm-bridge acp`, `/acp/remote`): `auto`, `single-agent:<provider id>`, `multi-agent` or `gateway:<local|openclaw>`",
    "acp.max_connections": "ACP remote transport: open connections at most, all clients together",
    "acp.connection_idle_ttl": "ACP remote transport: seconds a Streamable HTTP connection with no open stream and no request is kept",
    "acp.stream_buffer": "ACP remote transport: messages held for a stream that is not open; past that the connection is closed",
    "acp.list_page_size": "sessions per `session/list` page",
    "acp.cancel_requests": "send the client `$/cancel_request {requestId}` when the bridge settles an open `session/request_permission` itself (turn cancel, `agents.permission_timeout`, a console answer); off by default: the official Python SDK's client (0.12) logs an error on it",
    "multi_agent.max_iterations": "worker/reviewer rounds at most per turn (the planner runs once)",
    "multi_agent.score_threshold": "reviewer score (0-10) at or above which a draft is accepted; below it the workers rework it",
    "multi_agent.workers": "workers drafting in parallel each round (1-8)",
    "multi_agent.call_timeout": "deadline for each planner/worker/reviewer model call, in seconds",
    "multi_agent.max_tokens": "`max_tokens` of each model call",
    "multi_agent.base_url": "server-side model endpoint, used only when the client sends no `aiGatewayApiKey`; empty = `https://api.openai.com/v1`",
    "multi_agent.api_key": "server-side key for `base_url` (never sent to a client-chosen URL); empty = client key required",
    "multi_agent.allowed_hosts": "hosts (any port) or `host:port` a client's own `aiGatewayBaseUrl` (with its `aiGatewayApiKey`) may name for multi-agent turns, `*` = any; empty = loopback plus the configured endpoints; elsewhere the turn fails without a call; a URL or a port that is not a number is a config error",
    "toolbridge.llm_api_key": "key for the `chat` tool (secret)",
    "toolbridge.llm_base_url": "`chat` base URL (normalized to end in `/v1`); clients cannot change it",
    "toolbridge.llm_model": "`chat` model when the call names none",
    "toolbridge.chat_timeout": "deadline for one `chat` call, in seconds",
    "toolbridge.claude_bin": "Claude CLI executable for `claude_review` (looked up on `PATH`, run without a shell)",
    "toolbridge.claude_review_model": "default `--model` for `claude_review`",
    "toolbridge.claude_review_system": "default `--system-prompt` for `claude_review`",
    "toolbridge.claude_review_tools": "default `--tools` for `claude_review`",
    "toolbridge.claude_review_timeout": "deadline for one `claude_review` run, in seconds (process group killed after it)",
    "toolbridge.claude_output_max_bytes": "largest stdout/stderr kept from the Claude CLI (the run fails above it)",
    "toolbridge.vault_url": "Vault/OpenBao address for `vault_kv`",
    "toolbridge.vault_token": "Vault token for `vault_kv` (secret; prefer a narrowly scoped one)",
    "toolbridge.vault_namespace": "optional `X-Vault-Namespace`",
    "toolbridge.vault_timeout": "deadline for one Vault request, in seconds",
    "toolbridge.vault_allowed_paths": "`mount/path` prefixes `vault_kv` may touch (e.g. `secret/app`); empty = any",
    "toolbridge.max_concurrent_calls": "MCP tool calls run at once; up to 16 more requests wait while stdin is still read (cancels, pings), then reading stops",
    "router.llm_base_url": "classifier endpoint used with `llm_api_key` (the server key is never sent to a client-supplied URL); also the default for clients' own keys",
    "router.llm_api_key": "server key for the LLM routing classifier (secret; redacted in logs)",
    "router.classifier_timeout": "seconds allowed for one classifier call",
    "router.classifier_cache_ttl": "seconds a classifier answer is reused for the same prompt (0 = no cache)",
    "router.classifier_cache_entries": "most classifier answers kept in the cache",
    "router.classifier_allowed_hosts": "hosts (any port) or `host:port` a client's own `aiGatewayBaseUrl` (with its `aiGatewayApiKey`) may name for the classifier, `*` = any; empty = loopback plus the configured endpoints; elsewhere: no classifier call; a URL or a port that is not a number is a config error",
    "router.classifier_max_concurrency": "classifier calls in flight at once, process-wide",
    "router.memory_enabled": "read routing memory and record it after successful auto-routed turns",
    "router.memory_home": "directory holding `self-improving/` memory files; empty = `$HOME`",
    "router.memory_project_roots": "absolute roots under which `<workingDirectory>/.xworkmate/memory.md` is read and written; unset = `allowed_roots` (so existing clients keep project memory, confined); `[]` = nowhere",
    "router.memory_max_bytes": "a memory file above this size is rotated to `<file>.1` before the next append",
    "router.skill_commands_enabled": "allow running the skill finder/installer commands",
    "router.find_skills_bin": "skill finder executable (no arguments, no shell; run only when enabled)",
    "router.install_skill_bin": "skill installer executable (no arguments, no shell; run only when enabled)",
    "router.skill_command_timeout": "seconds a skill command may run before it is killed",
    "router.skill_command_max_output": "largest stdout accepted from a skill command",
    "mounts.codex_home": "Codex home whose `config.toml` may be rewritten; empty = `$HOME/.codex`",
    "mounts.opencode_home": "OpenCode home whose `config.toml` may be rewritten; empty = `$HOME/.opencode`",
    "mounts.openclaw_home": "OpenClaw home inspected; empty = `$HOME/.openclaw`",
    "mounts.cli_discovery_enabled": "run `claude mcp list` / `gemini mcp list` to count MCP servers",
    "mounts.cli_timeout": "seconds allowed for each discovery command",
    "gateway.connect_timeout": "seconds to open the gateway WebSocket",
    "gateway.challenge_timeout": "seconds to wait for `connect.challenge` after the dial",
    "gateway.hello_timeout": "seconds to wait for the `connect` response (`hello-ok`)",
    "gateway.request_timeout": "default deadline of `xworkmate.gateway.request`, in seconds",
    "gateway.turn_timeout": "deadline of a gateway-mode turn; on expiry the run is aborted (`chat.abort`); also the cap of a client's `timeoutMs` in `xworkmate.gateway.request` (or `request_timeout`, if larger)",
    "gateway.abort_timeout": "seconds allowed for the `chat.abort` of a cancelled or expired turn",
    "gateway.idle_ttl": "a runtime with no request and no live owner WebSocket for this long is closed",
    "gateway.backoff_initial": "first reconnect delay in seconds (doubles, with jitter, reset on hello-ok)",
    "gateway.backoff_max": "longest reconnect delay in seconds",
    "gateway.notify_timeout": "seconds one client may take to accept a gateway notification; past it (or with 256 waiting) that client gets no more of the runtime's notifications on that connection",
    "gateway.max_runtimes_per_principal": "runtimes one client token may hold",
    "gateway.max_runtimes": "runtimes of all clients together (a bridge without a token takes any bearer, each a new client); past it a connect is `TOO_MANY`",
    "gateway.max_message_bytes": "largest frame accepted from a gateway",
    "gateway.forward_client_bearer": "send the caller's bearer as `auth.token` to a `local` gateway given no token",
    "gateway.allowed_hosts": "hosts (any port) or `host:port` a `local` runtime may dial, `*` = any; empty = loopback (any port) plus the `host:port` of every endpoint in this config; a URL or a port that is not a number is a config error",
    "providers[].id": "provider id (unique, compared case-insensitively)",
    "providers[].label": "label shown in `acp.capabilities`",
    "providers[].endpoint": "`http(s)://` (HTTP, SSE when offered) or `ws(s)://` (WebSocket) ACP endpoint",
    "providers[].enabled": "a disabled provider is not advertised and cannot be routed to",
    "providers[].auth_header": '`Authorization` for this provider; unset = the shared upstream token; "" = none',
    "providers[].stream": "ask HTTP upstreams for SSE so notifications stream through",
    "providers[].connect_timeout": "seconds to connect",
    "providers[].read_timeout": "longest silence from the upstream, in seconds",
    "providers[].total_timeout": "hard cap on one forwarded turn, in seconds",
    "providers[].kind": "`http` (ACP over HTTP/WebSocket at `endpoint`) or `stdio` (local Zed-ACP agent run from `command`)",
    "providers[].command": "stdio agents: argv, run without a shell in its own process group (e.g. `[opencode, acp]`)",
    "providers[].env": "stdio agents: extra environment as `NAME=value` items",
    "providers[].cwd": "stdio agents: process working directory (default: the bridge's)",
    "providers[].fs_read": "stdio agents: advertise `fs.readTextFile` (false for gemini-cli, which cannot create files otherwise)",
    "providers[].models": "model ids this provider offers; ACP clients get them as the session's `model` option",
    "providers[].pass_env": "stdio agents: variable names (or `PREFIX_*`) copied from the bridge's environment, on top of `PATH`, `HOME`, `LANG`, `TMPDIR` and the registry entry's; never a bridge secret",
    "providers[].auth_method": "stdio agents: `authMethods` id sent in `authenticate` when the agent asks (`-32000`) or with `auth_on_start`",
    "providers[].auth_api_key": "stdio agents: API key for `auth_method`, sent in `authenticate` `_meta` (secret; e.g. `${GEMINI_API_KEY}`)",
    "providers[].auth_on_start": "stdio agents: authenticate right after `initialize`, not only when a session call asks for it",
    "providers[].model": "stdio agents: model when the turn names none (`configOptions` category `model`, else `session/set_model`)",
    "providers[].mode": "stdio agents: session mode set on every new session (`configOptions` category `mode`, else `session/set_mode`)",
    "providers[].options": "stdio agents: more session config options as `configId=value` items (`session/set_config_option`)",
    "providers[].mcp_servers": "stdio agents: MCP servers given on `session/new`/`load`/`resume`: `{name, type: stdio\\|http\\|sse, command, args, env: [NAME=value], url, headers: ['Name: value']}`; env and headers are secrets; http/sse only to agents whose `mcpCapabilities` take them",
    "providers[].toolbridge": "stdio agents: give the agent the bridge's own toolbridge as an MCP server (`<python> -m xwm_bridge toolbridge`)",
    "providers[].client_mcp_servers": "stdio agents: accept `mcpServers` sent by clients in turn params (else such a turn fails)",
    "providers[].writable_paths": "stdio agents under `agents.sandbox: bwrap`: more absolute paths the agent may write",
    "agents.initialize_timeout": "seconds for a stdio agent to start and answer `initialize`",
    "agents.session_timeout": "seconds for `session/new` / `session/load`",
    "agents.prompt_timeout": "hard cap on one `session/prompt`, in seconds (then `session/cancel`)",
    "agents.permission_timeout": "seconds a client has to answer a `permission` update before it is rejected",
    "agents.permission_rules": "list of `{action: allow|reject|ask, kind: <glob>, path: <glob>, streamless: bool}`; first match wins; none = ask; `path` of an `allow` rule must match every path of the call (locations, `diff` content, `rawInput` path fields such as a move's `destination`), of `reject`/`ask` any; `streamless: true` rules apply only to plain-JSON HTTP turns (e.g. keep `reject` there instead of waiting for an answer)",
    "console.enabled": "serve the operator console at `GET /console` (its methods are served either way)",
    "console.event_buffer": "events kept for `bridge.watch` watchers that reconnect with `since`",
    "console.watch_max_pending": "events one watcher may fall behind before its watch ends (it re-watches with its cursor)",
    "console.health_interval": "seconds between health and metrics samples on the event log",
    "console.allowed_origins": "browser origins (`scheme://host[:port]`, `:*` = any port) that may open `/console/ws` besides the page's own (an `Origin` whose host and port are the request's `Host`); the bridge-wide `allowed_origins` do not apply to it. Behind a proxy that rewrites `Host`, list the console's public origin here",
    "agents.permission_rules_file": "YAML rule list appended to `permission_rules`, re-read when it changes",
    "agents.fs_enabled": "serve `fs/read_text_file` / `fs/write_text_file` inside the session directory when under `allowed_roots`",
    "agents.fs_max_file_bytes": "largest file an agent may read or write through the bridge",
    "agents.terminal_enabled": "serve `terminal/*` (no shell, session directory under `allowed_roots`)",
    "agents.terminal_output_limit": "bytes of terminal output kept per terminal (oldest dropped)",
    "agents.terminal_max_running": "terminals one agent may have at once",
    "agents.stop_grace": "seconds between SIGTERM and SIGKILL when stopping an agent's process group",
    "agents.detect": "make the known agents (opencode, gemini, codex, claude, qwen, goose) found in `search_paths` or on `PATH` stdio providers",
    "agents.detect_skip": "registry ids never detected",
    "agents.search_paths": "absolute directories searched for agent executables before `PATH` (`:`-separated in env)",
    "agents.sandbox": "`none`, or `bwrap`: agents run under bubblewrap, writing only their session directory, their state dirs and a private `/tmp`; their `terminal/*` commands too (session directory only); with `allowed_roots` set, a session directory outside them is refused (it would be bound writable)",
    "agents.bwrap_path": "the bubblewrap executable (`agents.sandbox: bwrap`)",
    "agents.max_sandboxed_processes": "sandboxed agent processes kept at once (one per provider and working directory): past it the least recently used idle one is closed, never one with a call in flight (a turn, agent-adapter's `gemini.*`); when all are busy, see `agents.process_wait`",
    "agents.process_wait": "seconds a call that needs a new sandboxed agent process waits for one to become idle when all `agents.max_sandboxed_processes` are busy; then it fails (`all N sandboxed agent processes …`); 0 = fail at once",
    "agents.probe_timeout": "seconds `doctor` allows each stdio agent to start and answer `initialize`",
    "agents.toolbridge_env": "`NAME=value` items given to the toolbridge MCP server (`providers[].toolbridge`); the agent can see them",
}


def _default(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value) if value else "(empty)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _rows(cls: type[Any], prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    instance = cls() if cls is not ProviderConfig else ProviderConfig(id="x")
    for f in dataclasses.fields(cls):
        if f.name in NESTED_SECTIONS or f.name == "providers":
            continue
        key = f"{prefix}{f.name}"
        value = getattr(instance, f.name)
        rows.append(
            (
                key,
                _default(value) if cls is not ProviderConfig or f.name != "id" else "—",
                DESCRIPTIONS[key],
            )
        )
    return rows


def _bool_vars() -> str:
    return ", ".join(f"`{name}`" for name in BOOL_ENV_VARS)


def render() -> str:
    out = [
        "# Configuration reference",
        "",
        "Generated from `xwm_bridge/config/` by `python -m xwm_bridge.config_doc`; a test fails",
        "when this file drifts. Precedence: **defaults < YAML file < environment < flags**.",
        f"The YAML file is `--config FILE` or `{CONFIG_FILE_ENV}`; strings may use `${{VAR}}` or",
        "`${VAR:-default}`. Environment values are trimmed and a blank value counts as unset",
        "(an empty `--config ''` is an error: `--config: empty path`).",
        "A bad key or value stops the daemon at start with one line naming it (exit 2; an",
        "unknown key also names the nearest known one: `limts: unknown key (did you mean",
        "limits?)`). Numbers are finite and not negative (`.nan`, `.inf` and `-1` are errors;",
        "where a limit can be turned off, its row says `0`). A key written twice in one",
        "mapping is an error too (YAML would keep the last one: `duplicate key 'limits'`), and",
        "so is a credential YAML reads as a number or a boolean (`auth_token: 0123` is 83:",
        "quote it).",
        "",
        f"A boolean **environment variable** ({_bool_vars()}:",
        "every one the bridge reads) takes `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`",
        "(any case); any other value is not an error (the original's **flag** rule): the",
        "key's default applies and the bridge logs a warning at start naming the variable,",
        "the value and the default (the value is left out for a variable whose name says",
        "TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL). In the YAML file such a value is an",
        "error.",
        "",
        "## Top-level keys",
        "",
        "| Key | Env var | Default | Meaning |",
        "| --- | --- | --- | --- |",
    ]
    for key, default, doc in _rows(BridgeConfig, ""):
        env = f"`{ENV_VARS[key]}`" if key in ENV_VARS else "—"
        out.append(f"| `{key}` | {env} | {default} | {doc} |")
    out += ["", "## `limits`", "", "| Key | Default | Meaning |", "| --- | --- | --- |"]
    for key, default, doc in _rows(Limits, "limits."):
        out.append(f"| `{key}` | {default} | {doc} |")
    for section, cls in NESTED_SECTIONS.items():
        if section == "limits":
            continue
        out += [
            "",
            f"## `{section}`",
            "",
            "| Key | Env var | Default | Meaning |",
            "| --- | --- | --- | --- |",
        ]
        for key, default, doc in _rows(cls, f"{section}."):
            env = f"`{NESTED_ENV_VARS[key]}`" if key in NESTED_ENV_VARS else "—"
            out.append(f"| `{key}` | {env} | {default} | {doc} |")
    out += [
        "",
        "## `providers` (list; order is the catalog order)",
        "",
        "| Key | Default | Meaning |",
        "| --- | --- | --- |",
    ]
    for key, default, doc in _rows(ProviderConfig, "providers[]."):
        out.append(f"| `{key}` | {default} | {doc} |")
    out += [
        "",
        "Each provider's endpoint can also be set from the environment as",
        "`XWM_PROVIDER_<ID>_URL` (id upper-cased, other characters as `_`). Default catalog:",
        "",
        "| id | label | endpoint | env override |",
        "| --- | --- | --- | --- |",
    ]
    for p in DEFAULT_PROVIDERS:
        out.append(f"| `{p.id}` | {p.label} | `{p.endpoint}` | `{provider_env_var(p.id)}` |")
    out += [
        "",
        "## Outbound proxies (environment only)",
        "",
        "Read once at start-up from the bridge's own environment (`xwm_bridge/proxy.py`),",
        "never from a client; they apply to every outbound call and dial: upstream ACP",
        "(HTTP and WebSocket), OpenClaw gateways, LLM calls (classifier, multi-agent,",
        "toolbridge `chat`), accounts bootstrap, Vault, `doctor`, `xwm-bridge client`.",
        "The lower-case name wins when both are set (an empty lower-case value means none).",
        "",
        "| Env var | Default | Meaning |",
        "| --- | --- | --- |",
        "| `http_proxy`, `HTTP_PROXY` | — | proxy for `http://` and `ws://` targets: "
        "`http://[user:password@]host[:port]` (no scheme = `http://`, port 80); other "
        "schemes are a config error |",
        "| `https_proxy`, `HTTPS_PROXY` | — | proxy for `https://` and `wss://` targets "
        "(a CONNECT tunnel), same form |",
        "| `no_proxy`, `NO_PROXY` | — | comma- or space-separated: `*`, host names "
        "(`example.com` = `.example.com`: the name and every name under it), `host:port`, "
        "IP literals (`::1`, `[::1]:8080`), CIDR blocks; loopback is **not** excluded "
        "unless listed |",
    ]
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
