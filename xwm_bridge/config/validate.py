"""The checks a built config must pass (:func:`_validate`); each failure is one
:class:`~xwm_bridge.config.model.ConfigError` line naming the key."""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import urlsplit

from xwm_bridge.config.env_vars import SECRET_ENV_VARS
from xwm_bridge.config.model import (
    LOG_FORMATS,
    LOG_LEVELS,
    MCP_TYPES,
    BridgeConfig,
    ConfigError,
    ProviderConfig,
)
from xwm_bridge.config.sections import SANDBOXES, STORE_BACKENDS
from xwm_bridge.endpoint import EndpointError, derive_endpoint
from xwm_bridge.netaddr import parse_listen


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
        # the item is not echoed: a value without its name is most likely a credential
        for k, item in enumerate(m.env):
            if "=" not in item or not item.split("=", 1)[0]:
                raise ConfigError(f"{where}.env[{k}]: expected NAME=value")
        for k, item in enumerate(m.headers):
            if ":" not in item or not item.split(":", 1)[0].strip():
                raise ConfigError(f"{where}.headers[{k}]: expected 'Name: value'")
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
    for i, origin in enumerate(config.allowed_origins):
        if not is_origin_rule(origin):  # it allowed nothing, and nobody was told
            raise ConfigError(
                f"allowed_origins[{i}]: expected scheme://host[:port] or scheme://host:*, "
                f"got {origin!r}"
            )
    for i, name in enumerate(config.allowed_hosts):
        if not name.strip() or any(c in name for c in " \t/@"):
            raise ConfigError(f"allowed_hosts[{i}]: expected a host name, got {name!r}")
    for key, entries in (
        ("multi_agent.allowed_hosts", config.multi_agent.allowed_hosts),
        ("router.classifier_allowed_hosts", config.router.classifier_allowed_hosts),
        ("gateway.allowed_hosts", config.gateway.allowed_hosts),
    ):
        for i, entry in enumerate(entries):
            if not _is_dial_entry(entry):  # it matched nothing, and loopback went with it
                raise ConfigError(
                    f"{key}[{i}]: expected host, host:port, [IPv6]:port or *, got {entry!r}"
                )
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
    # 0 read no memory file at all (a 0-byte read cap, rotation off); 0 output bytes
    # made every skill command's answer "too large"
    for name in ("memory_max_bytes", "skill_command_max_output"):
        if getattr(config.router, name) <= 0:
            raise ConfigError(f"router.{name}: must be greater than 0")
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
    if ag.process_wait < 0:
        raise ConfigError("agents.process_wait: must be 0 or more")
    for i, d in enumerate(ag.search_paths):
        if not os.path.isabs(d):
            raise ConfigError(f"agents.search_paths[{i}]: must be an absolute path, got {d!r}")
    for j, item in enumerate(ag.toolbridge_env):
        if "=" not in item or not item.split("=", 1)[0]:
            raise ConfigError(f"agents.toolbridge_env[{j}]: expected NAME=value")
    _validate_openclaw_url(config.openclaw_url)
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
        "max_runtimes",
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
    _validate_redis_url(config.store.redis_url)
    if config.store.redis_timeout <= 0 or config.store.lease_ttl < 1:
        raise ConfigError("store: redis_timeout must be > 0 and lease_ttl at least 1 second")
    cc = config.console
    if cc.event_buffer < 16 or cc.watch_max_pending < 16:
        raise ConfigError("console: event_buffer and watch_max_pending must be at least 16")
    if cc.health_interval < 0.1:
        raise ConfigError("console.health_interval: must be at least 0.1 seconds")
    for i, origin in enumerate(cc.allowed_origins):
        if not _is_origin(origin):
            raise ConfigError(
                f"console.allowed_origins[{i}]: expected http(s)://host[:port|:*], got {origin!r}"
            )
    if config.limits.max_body_bytes <= 0 or config.limits.max_ws_message_bytes <= 0:
        raise ConfigError("limits: size limits must be greater than 0")
    _validate_acp(config)


def _is_dial_entry(entry: str) -> bool:
    """An entry of a dial allow-list (netaddr.py ``HostPolicy``): ``*``, a host, a bare
    IPv6 address, ``host:port`` or ``[IPv6]:port``. A URL (``https://gw.example``) or a
    port that is not a number was kept whole and allowed nothing."""
    value = entry.strip()
    if not value or any(c in value for c in " \t/@?#"):
        return False
    if value.startswith("["):
        inner, _, rest = value[1:].partition("]")
        port_ok = rest == "" or (rest[:1] == ":" and rest[1:].isascii() and rest[1:].isdigit())
        return port_ok and _is_ipv6(inner)
    if value.count(":") > 1:
        return _is_ipv6(value)
    host, sep, port = value.partition(":")
    return bool(host) and (not sep or (port.isascii() and port.isdigit() and int(port) < 65536))


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def is_origin_rule(entry: str) -> bool:
    """An entry the origin allow-list can use (transport/security.py ``OriginRule``):
    a scheme and a host, ``:*`` for any port; any scheme (``tauri://localhost``)."""
    text = entry.strip()
    text = text[:-2] if text.endswith(":*") else text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return bool(parts.scheme and parts.hostname)


def _is_origin(entry: str) -> bool:
    """``http(s)://host[:port]`` or ``http(s)://host:*``, nothing after it."""
    text = entry.strip()
    text = text[:-2] if text.endswith(":*") else text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return False
    return (
        parts.scheme.lower() in ("http", "https")
        and bool(parts.hostname)
        and parts.path in ("", "/")
        and not (parts.query or parts.fragment or parts.username)
    )


def _validate_openclaw_url(url: str) -> None:
    """``ws(s)://host[:port][/path]``: anything else was dialed (and failed) forever.
    Empty: no OpenClaw gateway (an ``openclaw`` connect says the endpoint is missing).
    The value is not echoed: a URL may carry credentials."""
    if not url.strip():
        return
    try:
        parts = urlsplit(url.strip())
        ok = parts.scheme in ("ws", "wss") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port past 65535, a bad IPv6 literal
        ok = False
    if not ok:
        raise ConfigError("openclaw_url: expected ws://host[:port][/path] or wss://…")


#: what redis-py's ``from_url`` takes
REDIS_SCHEMES = ("redis", "rediss", "unix")


def _validate_redis_url(url: str) -> None:
    """``redis[s]://[[user]:password@]host[:port][/db]`` or ``unix:///path``: anything
    else was a traceback when the store opened (serve, doctor), and ``doctor --offline``
    called it valid. The value is not echoed: it may carry the password."""
    problem = ""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises on a port past 65535
    except ValueError as exc:  # a bad port, an unclosed IPv6 bracket
        problem = str(exc)
    else:
        db = parts.path.strip("/")
        if parts.scheme not in REDIS_SCHEMES:
            problem = "expected redis://host[:port][/db], rediss://… or unix:///path"
        elif parts.scheme == "unix" and not parts.path:
            problem = "unix:// needs the socket's path (unix:///run/redis.sock)"
        elif parts.scheme != "unix" and not parts.hostname:
            problem = "no host (redis://host[:port][/db])"
        elif parts.scheme != "unix" and db and not (db.isascii() and db.isdigit()):
            problem = "the path is the database number (redis://host:6379/0)"
    if problem:
        raise ConfigError(f"store.redis_url: {problem}")


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
