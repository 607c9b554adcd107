"""``xwm-bridge serve``: the bridge over HTTP and WebSocket (``_serve`` also runs
``agent-adapter``)."""

from __future__ import annotations

import asyncio
import errno
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from xwm_bridge.cli.common import (
    CONFIG_OPTION,
    EXIT_CONFIG,
    EXIT_FORCED,
    EXIT_LISTEN,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    Signals,
    _fail,
    _run,
    log,
    start_logging,
)
from xwm_bridge.cli.group import cli
from xwm_bridge.config import BridgeConfig, ConfigError, load_config
from xwm_bridge.heap import freeze_startup
from xwm_bridge.observability.logging import flush_logs
from xwm_bridge.store.base import StoreError

if TYPE_CHECKING:  # imported lazily at run time (``--help`` stays fast)
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.observability.sdnotify import Notifier
    from xwm_bridge.proxy import ProxySettings
    from xwm_bridge.transport.serving import Server


@cli.command()
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default=None,
    help="Listen address (env ACP_LISTEN_ADDR; default 127.0.0.1:8787). Port 0 picks a free port.",
)
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    default=None,
    help="Allow a non-loopback listen address without ACP_AUTH_TOKEN (any bearer is accepted). "
    "Off by default: the bridge refuses to start that way.",
)
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def serve(
    listen: str | None,
    allow_unauthenticated: bool | None,
    config_file: str | None,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """Serve the bridge over HTTP and WebSocket.

    \b
    Routes:
      POST /acp/rpc   JSON-RPC; SSE stream when Accept: text/event-stream
      GET  /acp       JSON-RPC over WebSocket
      GET  /console, /console/   the operator console (token asked in the page;
                      console.enabled), its files /console/static/{name} and its
                      WebSocket /console/ws
      GET  /acp/sessions/{sessionId}/events   SSE catch-up (Last-Event-ID, ?follow=1)
      /acp/remote     the bridge as an ACP agent (WebSocket; Streamable HTTP)
      /livez, /readyz, /metrics   liveness, readiness, Prometheus (no auth)
      /, /api/ping, /bridge/bootstrap/health, /bridge/bootstrap/consume

    \b
    Methods: acp.capabilities, session.start, session.message, session.cancel,
    session.close, session.permission, session.replay, xworkmate.routing.resolve,
    xworkmate.dispatch.resolve, xworkmate.mounts.reconcile, xworkmate.gateway.connect,
    xworkmate.gateway.request, xworkmate.gateway.disconnect; operator views:
    session.list, session.get, permission.list, bridge.watch, bridge.health,
    bridge.config.

    \b
    Security: bearer token ACP_AUTH_TOKEN (constant-time check), origin
    allow-list ACP_ALLOWED_ORIGINS, body and message limits from the config.
    Without a token, only requests naming the bridge's own host (an IP, localhost,
    the listen host, XWM_ALLOWED_HOSTS) are answered; others get 421 (DNS rebinding).
    Upstream credentials: INTERNAL_SERVICE_TOKEN, else BRIDGE_AUTH_TOKEN.
    Outbound calls and dials honour HTTP_PROXY, HTTPS_PROXY and NO_PROXY.
    Local agents: known ACP agents found on PATH (opencode, gemini, codex-acp,
    claude-agent-acp, qwen, goose) become providers (agents.detect, XWM_AGENTS_DETECT).
    Stops on SIGTERM/SIGINT (and SIGHUP, unless nohup ignores it) after letting
    running turns finish (limits.shutdown_grace); a second signal cancels them and
    exits 1.
    """
    from xwm_bridge.netaddr import is_loopback_host, parse_listen

    try:
        loaded = load_config(
            config_file=config_file,
            flags={
                "listen": listen,
                "allow_unauthenticated": allow_unauthenticated,
                "log_level": log_level,
                "log_format": log_format,
            },
        )
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)
    cfg = loaded.config
    host, port = parse_listen(cfg.listen)
    if not is_loopback_host(host) and not cfg.authenticates and not cfg.allow_unauthenticated:
        _fail(
            f"refusing to listen on {cfg.listen}{_no_token()}: set a token, "
            "or pass --allow-unauthenticated if a proxy in front authenticates clients",
            EXIT_CONFIG,
        )
    start_logging(cfg, loaded)
    code = _run(_serve(cfg, host, port, sources=loaded.sources, proxies=loaded.proxies))
    sys.exit(code)


def _no_token() -> str:
    """Why there is no token: ``ACP_AUTH_TOKEN=$TOKEN`` with TOKEN unset sets it empty,
    which counts as unset; saying only "without ACP_AUTH_TOKEN" reads as a bug then."""
    raw = os.environ.get("ACP_AUTH_TOKEN")
    if raw is not None and not raw.strip():
        return ": ACP_AUTH_TOKEN is empty"
    return " without ACP_AUTH_TOKEN"


async def _serve(
    cfg: BridgeConfig,
    host: str,
    port: int,
    adapter: Any = None,
    sources: Mapping[str, str] | None = None,
    proxies: ProxySettings | None = None,
) -> int:
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.dispatcher import Dispatcher
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.observability.sdnotify import Notifier
    from xwm_bridge.transport.http import SERVE_PATHS, HttpTransport
    from xwm_bridge.transport.serving import Server

    notifier = Notifier.from_env()  # systemd Type=notify; agents never see the socket
    bridge = Bridge(cfg, sources, proxies)  # None: read from the environment
    paths: tuple[str, ...]
    if adapter is None:
        table, paths = BridgeMethods(bridge).table(), SERVE_PATHS
    else:  # agent-adapter: same server, its own method table and routes
        from xwm_bridge.adapters.agent_adapter import ADAPTER_PATHS, AdapterMethods

        table, paths = AdapterMethods(bridge, adapter).table(), ADAPTER_PATHS
    transport = HttpTransport(bridge, Dispatcher(table, bridge.metrics))
    server = Server(transport, paths)
    stop = asyncio.Event()

    def on_first() -> None:
        notifier.stopping()
        stop.set()

    # handlers first: a SIGTERM as soon as the port is open or READY=1 is sent (what a
    # supervisor or a test does) must start the drain, not hit the default action
    signals = Signals(on_first, cfg.limits.shutdown_grace)
    signals.on_force = bridge.force_shutdown
    try:
        # the spec's words: contract.md (serve), adapters.md §1.1 (agent-adapter)
        failed = "ACP server failed" if adapter is None else "gemini adapter failed"
        return await _serve_until_stopped(cfg, bridge, server, notifier, stop, host, port, failed)
    finally:
        signals.remove()


async def _serve_until_stopped(
    cfg: BridgeConfig,
    bridge: Bridge,
    server: Server,
    notifier: Notifier,
    stop: asyncio.Event,
    host: str,
    port: int,
    failed: str,
) -> int:
    try:
        await server.setup()  # starts the bridge (the app's cleanup_ctx)
    except StoreError as exc:
        click.echo(f"xwm-bridge: {exc}", err=True)
        await bridge.close(0)
        return EXIT_CONFIG
    try:
        actual_port = await server.listen(host or None, port)
    except OSError as exc:
        await server.close()  # its log lines first: the failure is the last line
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            hint = f" (another process listens on {where}: ss -ltnp 'sport = :{port}')"
        flush_logs()  # the sink writes from its own thread
        click.echo(f"{failed}: {exc}{hint}", err=True)
        return EXIT_LISTEN
    if not cfg.available_providers:
        log.warning(
            "no provider is enabled",
            extra={
                "hint": "single-agent turns answer unavailable; enable a provider in "
                "providers: (endpoint, or kind: stdio with a command), see doctor"
            },
        )
    log.info(
        "listening",
        extra={
            "host": host,
            "port": actual_port,
            "providers": [p.id for p in bridge.config.available_providers],
            "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        },
    )
    freeze_startup()  # start-up objects leave the GC's generations (heap.py)
    if not stop.is_set():  # a signal during start-up: STOPPING=1 was sent already
        notifier.ready(f"listening on {host}:{actual_port}")
    await stop.wait()
    await server.close()  # stop listening, drain turns, close sockets, close the bridge
    log.info("stopped", extra={"forced": bridge.forced})
    return EXIT_FORCED if bridge.forced else 0
