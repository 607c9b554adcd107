"""``xwm-bridge agent-adapter`` (alias ``gemini-adapter``): one stdio ACP agent as a
bridge-protocol service, on the server of ``serve``."""

from __future__ import annotations

import sys

import click

from xwm_bridge.cli.common import (
    CONFIG_OPTION,
    EXIT_CONFIG,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    _fail,
    _load,
    _run,
    start_logging,
)
from xwm_bridge.cli.group import cli
from xwm_bridge.cli.serve import _serve
from xwm_bridge.config import ConfigError


@cli.command("agent-adapter")
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default=None,
    help="Listen address (env GEMINI_ADAPTER_LISTEN_ADDR; default 127.0.0.1:8791).",
)
@click.option(
    "--agent-bin",
    "--gemini-bin",
    "agent_bin",
    metavar="PATH",
    default=None,
    help="Agent executable (env GEMINI_ADAPTER_BIN, else ACP_GEMINI_BIN; default gemini).",
)
@click.option(
    "--agent-args",
    "--gemini-args",
    "agent_args",
    metavar="ARGS",
    default=None,
    help="Agent arguments, shell-quoted (env GEMINI_ADAPTER_ARGS; default --acp).",
)
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def agent_adapter(
    listen: str | None,
    agent_bin: str | None,
    agent_args: str | None,
    config_file: str | None,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Expose one stdio ACP agent (default: gemini --acp) as a bridge-protocol service.

    \b
    Routes: POST /acp/rpc (JSON, or SSE with Accept: text/event-stream), GET /acp (WebSocket),
    /livez, /readyz, /metrics.
    Methods: acp.capabilities, session.start, session.message, session.cancel,
    session.close, session.permission, session.replay, gemini.initialize, gemini.raw;
    operator views: session.list, session.get. Env: GEMINI_ADAPTER_AUTH_TOKEN,
    GEMINI_ADAPTER_ALLOWED_ORIGINS, GEMINI_ADAPTER_PROVIDER_ID|LABEL,
    GEMINI_ADAPTER_PROTOCOL_VERSION, GEMINI_ADAPTER_UPSTREAM_METHOD.
    With --config, a kind: stdio provider with that id in providers: supplies the label,
    command, env and cwd (flags, then env vars, replace the parts they name); agents.*
    (permissions, fs, terminal), allowed_roots and limits come from it too.
    """
    import os

    from xwm_bridge.adapters.agent_adapter import AdapterSettings
    from xwm_bridge.netaddr import is_loopback_host, parse_listen

    loaded = _load(config_file, log_level=log_level, log_format=log_format)
    base = loaded.config
    try:
        settings = AdapterSettings.from_env(
            os.environ, listen=listen, agent_bin=agent_bin, agent_args=agent_args
        )
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)
    try:
        host, port = parse_listen(settings.listen)
    except ValueError as exc:
        source = "--listen" if listen else "GEMINI_ADAPTER_LISTEN_ADDR"
        _fail(f"config error: {source}: {exc}", EXIT_CONFIG)
    cfg = settings.bridge_config(base)
    if not is_loopback_host(host) and not cfg.auth_token:
        _fail(
            f"refusing to listen on {settings.listen} without GEMINI_ADAPTER_AUTH_TOKEN",
            EXIT_CONFIG,
        )
    start_logging(cfg, loaded, (settings.auth_token,))
    sys.exit(_run(_serve(cfg, host, port, adapter=settings)))


cli.add_command(agent_adapter, name="gemini-adapter")
