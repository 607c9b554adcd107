"""Command line: ``xwm-bridge serve``, ``acp-stdio`` and ``toolbridge`` (the default)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, NoReturn

import click

from xwm_bridge import __version__
from xwm_bridge.config import (
    CONFIG_FILE_ENV,
    LOG_FORMATS,
    LOG_LEVELS,
    BridgeConfig,
    ConfigError,
    load_config,
)
from xwm_bridge.heap import freeze_startup
from xwm_bridge.observability.logging import flush_logs, setup_logging
from xwm_bridge.store.base import StoreError
from xwm_bridge.wire import WireEncoder

log = logging.getLogger("xwm_bridge")

EXIT_CONFIG = 2
EXIT_LISTEN = 1
#: a second SIGTERM/SIGINT cut the drain short
EXIT_FORCED = 1
FORCE_HINT = "send SIGTERM or SIGINT again to cancel running turns and exit now"
# The original accepted Go-style single-dash flags (-listen ADDR, -listen=ADDR).
_SINGLE_DASH = re.compile(r"^-(listen|config|log-level|allow-unauthenticated)(=.*)?$")

CONFIG_OPTION = click.option(
    "--config",
    "config_file",
    metavar="FILE",
    envvar=CONFIG_FILE_ENV,
    help=f"YAML config file (env {CONFIG_FILE_ENV}). Precedence: defaults < file < env < flags.",
)
LOG_LEVEL_OPTION = click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Log level of the log lines on stderr (env XWM_LOG_LEVEL; default info).",
)
LOG_FORMAT_OPTION = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default=None,
    help="json (one object per line), text (human-readable) or auto: text when stderr "
    "is a terminal, else JSON (env XWM_LOG_FORMAT; default auto).",
)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"xwm-bridge: {message}", err=True)
    sys.exit(code)


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when the ``[fast]`` extra is installed (≈12% less CPU per turn)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class Signals:
    """SIGTERM/SIGINT: the first starts the shutdown (``on_first``) and says in the log
    that another one forces the exit; the second calls ``on_force`` (cancel running
    turns now); a third exits at once. Installed until :meth:`remove`."""

    def __init__(self, on_first: Callable[[], None], grace_s: float) -> None:
        self.on_first = on_first
        self.on_force: Callable[[], None] | None = None
        self.grace_s = grace_s
        self.count = 0
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        self.count += 1
        name = signal.Signals(sig).name
        if self.count == 1:
            log.info(
                "shutting down", extra={"signal": name, "grace_s": self.grace_s, "hint": FORCE_HINT}
            )
            self.on_first()
        elif self.count == 2 and self.on_force is not None:
            log.warning("second signal: forcing the exit", extra={"signal": name})
            self.on_force()
        else:
            log.warning("signal again: exiting now", extra={"signal": name})
            flush_logs()
            os._exit(EXIT_FORCED)

    def remove(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.remove_signal_handler(sig)


async def _until_signal(
    main: Coroutine[Any, Any, None],
    grace_s: float = 0.0,
    finish: Callable[[Signals], Awaitable[None]] | None = None,
) -> bool:
    """Run a stdio server until it ends (end of input) or SIGTERM/SIGINT cancels it,
    then ``finish`` (the drain) with the signal handlers still installed, so a second
    signal forces the exit. True when a signal stopped it."""
    async with asyncio.TaskGroup() as group:
        task = group.create_task(main, name="stdio-server")

        def stop() -> None:
            task.cancel()

        signals = Signals(stop, grace_s)
    try:
        if finish is not None:
            await finish(signals)
    finally:
        signals.remove()
    return signals.count > 0


def _load(config_file: str | None, **flags: Any) -> BridgeConfig:
    try:
        return load_config(config_file=config_file, flags=flags).config
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="xwm-bridge")
def cli() -> None:
    """xwm-bridge routes coding-agent sessions.

    Clients speak one JSON-RPC contract; the bridge runs each turn on an upstream
    ACP provider, a local stdio ACP agent, the multi-agent loop or an OpenClaw
    gateway, and streams progress back as session.update notifications.

    \b
    Methods (serve, acp-stdio):
      acp.capabilities
      session.start, session.message, session.cancel, session.close,
      session.permission, session.replay
      xworkmate.routing.resolve, xworkmate.dispatch.resolve, xworkmate.mounts.reconcile
      xworkmate.gateway.connect, xworkmate.gateway.request, xworkmate.gateway.disconnect
      session.list, session.get, permission.list, bridge.watch, bridge.health,
      bridge.config (the operator views; the console and `xwm-bridge client` use them)

    With no command, the MCP toolbridge runs on stdin/stdout (as the original).
    Shell completion: eval "$(_XWM_BRIDGE_COMPLETE=bash_source xwm-bridge)"
    (zsh_source, fish_source for those shells).
    """


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
    Upstream credentials: INTERNAL_SERVICE_TOKEN, else BRIDGE_AUTH_TOKEN.
    Local agents: known ACP agents found on PATH (opencode, gemini, codex-acp,
    claude-agent-acp, qwen, goose) become providers (agents.detect, XWM_AGENTS_DETECT).
    Stops on SIGTERM/SIGINT after letting running turns finish (limits.shutdown_grace);
    a second signal cancels them and exits 1.
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
            f"refusing to listen on {cfg.listen} without ACP_AUTH_TOKEN: set a token, "
            "or pass --allow-unauthenticated if a proxy in front authenticates clients",
            EXIT_CONFIG,
        )
    setup_logging(cfg.log_level, cfg.secrets(), log_format=cfg.log_format)
    code = _run(_serve(cfg, host, port, sources=loaded.sources))
    sys.exit(code)


async def _serve(
    cfg: BridgeConfig,
    host: str,
    port: int,
    adapter: Any = None,
    sources: Mapping[str, str] | None = None,
) -> int:
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.dispatcher import Dispatcher
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.observability.sdnotify import Notifier
    from xwm_bridge.transport.http import SERVE_PATHS, HttpTransport
    from xwm_bridge.transport.serving import Server

    notifier = Notifier.from_env()  # systemd Type=notify; agents never see the socket
    bridge = Bridge(cfg, sources)
    paths: tuple[str, ...]
    if adapter is None:
        table, paths = BridgeMethods(bridge).table(), SERVE_PATHS
    else:  # agent-adapter: same server, its own method table and routes
        from xwm_bridge.adapters.agent_adapter import ADAPTER_PATHS, AdapterMethods

        table, paths = AdapterMethods(bridge, adapter).table(), ADAPTER_PATHS
    transport = HttpTransport(bridge, Dispatcher(table, bridge.metrics))
    server = Server(transport, paths)
    try:
        await server.setup()  # starts the bridge (the app's cleanup_ctx)
    except StoreError as exc:
        click.echo(f"xwm-bridge: {exc}", err=True)
        await bridge.close(0)
        return EXIT_CONFIG
    try:
        actual_port = await server.listen(host or None, port)
    except OSError as exc:
        click.echo(f"ACP server failed: {exc}", err=True)
        await server.close()
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
    notifier.ready(f"listening on {host}:{actual_port}")
    stop = asyncio.Event()

    def on_first() -> None:
        notifier.stopping()
        stop.set()

    signals = Signals(on_first, cfg.limits.shutdown_grace)
    signals.on_force = bridge.force_shutdown
    try:
        await stop.wait()
        await server.close()  # stop listening, drain turns, close sockets, close the bridge
    finally:
        signals.remove()
    log.info("stopped", extra={"forced": bridge.forced})
    return EXIT_FORCED if bridge.forced else 0


@cli.command("acp-stdio")
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def acp_stdio(config_file: str | None, log_level: str | None, log_format: str | None) -> None:
    """Serve the bridge contract on stdin/stdout (for use as a child process).

    Input: newline-delimited JSON or Content-Length framed messages. Output: one
    compact JSON object per line (responses and session.update notifications).
    Requests run concurrently, so session.cancel interrupts a running turn.
    Logs go to stderr. Exits 0 at end of input once running requests finish.
    """
    cfg = _load(config_file, log_level=log_level, log_format=log_format)
    setup_logging(cfg.log_level, cfg.secrets(), log_format=cfg.log_format)
    sys.exit(_run(_acp_stdio(cfg)))


async def _acp_stdio(cfg: BridgeConfig) -> int:
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.dispatcher import Dispatcher
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.transport.stdio import StdioServer, stdin_reader, stdout_writer

    bridge = Bridge(cfg)
    try:
        await bridge.start()
    except StoreError as exc:
        click.echo(f"xwm-bridge: {exc}", err=True)
        await bridge.close(0)
        return EXIT_CONFIG
    try:
        server = StdioServer(
            Dispatcher(BridgeMethods(bridge).table(), bridge.metrics),
            stdin_reader(),
            stdout_writer(),
            max_message=cfg.limits.max_body_bytes,
            send_timeout=cfg.limits.notification_send_timeout,
            wire=WireEncoder(cfg.credentials()),
        )

        async def finish(signals: Signals) -> None:
            signals.on_force = bridge.force_shutdown
            await bridge.close()

        await _until_signal(server.serve(), cfg.limits.shutdown_grace, finish)
    finally:
        await bridge.close()  # a no-op after finish; closes the store if serve() failed
    return EXIT_FORCED if bridge.forced else 0


@cli.command("acp")
@CONFIG_OPTION
@LOG_LEVEL_OPTION
def acp(config_file: str | None, log_level: str | None) -> None:
    """Be an ACP agent on stdin/stdout, for editors (Zed) and ACP clients.

    \b
    Agent Client Protocol v1, newline-delimited JSON-RPC. Each session/prompt is
    one bridge turn: routed (session config option "route": auto, a provider,
    multi-agent or a gateway; default acp.default_route), queued, cancellable
    (session/cancel), persisted (session/list, session/load, session/resume after
    a restart). A stdio agent's permission requests, and its fs/* and terminal/*
    when the client declares them, are relayed to the client.
    Sessions are kept in <state dir>/acp unless store.state_dir (XWM_STATE_DIR)
    is set, apart from a serve daemon's. Logs go to stderr. Exits 0 at end of input.
    """
    from xwm_bridge.store import with_own_state_dir

    cfg = with_own_state_dir(_load(config_file, log_level=log_level), "acp")
    setup_logging(cfg.log_level, cfg.secrets())
    sys.exit(_run(_acp(cfg)))


async def _acp(cfg: BridgeConfig) -> int:
    from xwm_bridge.acp.front import AcpFrontDoor
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.transport.acp_stdio import serve_acp_stdio
    from xwm_bridge.transport.stdio import stdin_reader, stdout_writer

    bridge = Bridge(cfg)
    try:
        await bridge.start()
    except StoreError as exc:
        click.echo(f"xwm-bridge: {exc}", err=True)
        await bridge.close(0)
        return EXIT_CONFIG
    front = AcpFrontDoor(bridge)
    try:
        await _until_signal(
            serve_acp_stdio(
                front,
                stdin_reader(),
                stdout_writer(),
                max_message=cfg.limits.max_body_bytes,
                send_timeout=cfg.limits.notification_send_timeout,
                grace=cfg.limits.shutdown_grace,
            )
        )
    finally:
        await front.close()
        await bridge.close()
    return 0


@cli.command()
@CONFIG_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
@click.option(
    "--offline",
    is_flag=True,
    help="Validate the config only: no network, no agent started, no store opened.",
)
def doctor(config_file: str | None, as_json: bool, offline: bool) -> None:
    """Show the effective config (secrets masked, with where each value came from)
    and check every configured component: HTTP/WS providers answer acp.capabilities;
    stdio agents (configured, or known ones found on PATH) start and answer initialize
    within agents.probe_timeout; the OpenClaw gateway accepts a connection when one is
    configured (openclaw_url or openclaw_token set); the session store can be written.
    Known agents that were not found are listed with the reason (not a failure).

    \b
    Exits 0 when every check passes (warnings, e.g. a stdio provider without a
    command, do not fail it), 1 when a configured component fails or the auth
    policy would refuse to start, 2 on a config error.
    """
    import orjson

    from xwm_bridge.doctor import masked_config, passed, render_text, run_checks
    from xwm_bridge.observability.redact import Redactor

    try:
        loaded = load_config(config_file=config_file)
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)
    checks = asyncio.run(run_checks(loaded, offline=offline))
    config = masked_config(loaded)
    redactor = Redactor(loaded.config.secrets())  # a secret quoted in an error text, too
    if as_json:
        doc = {"config": config, "sources": dict(loaded.sources), "checks": checks}
        click.echo(redactor.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(redactor.text(render_text(config, loaded.sources, checks)))
    sys.exit(0 if passed(checks) else 1)


@cli.command("toolbridge")
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def toolbridge(config_file: str | None, log_level: str | None, log_format: str | None) -> None:
    """Serve the MCP tool bridge on stdin/stdout (also the mode when no command is given).

    \b
    Tools: chat (OpenAI-compatible; LLM_API_KEY, LLM_BASE_URL, LLM_MODEL),
    claude_review (the Claude CLI; CLAUDE_BIN, CLAUDE_REVIEW_*),
    vault_kv (KV v2; VAULT_SERVER_URL, VAULT_SERVER_ROOT_ACCESS_TOKEN, VAULT_NAMESPACE).
    Input: newline JSON or Content-Length frames; output: one JSON object per line.
    Logs go to stderr. Exits 0 at end of input once running calls finish.
    """
    cfg = _load(config_file, log_level=log_level, log_format=log_format)
    setup_logging(cfg.log_level, cfg.secrets(), log_format=cfg.log_format)
    sys.exit(_run(_toolbridge(cfg)))


async def _toolbridge(cfg: BridgeConfig) -> int:
    import aiohttp

    from xwm_bridge.toolbridge.server import ToolbridgeServer
    from xwm_bridge.transport.stdio import stdin_reader, stdout_writer

    async with aiohttp.ClientSession(trust_env=False) as http:
        server = ToolbridgeServer(
            cfg.toolbridge,
            http,
            stdin_reader(),
            stdout_writer(),
            max_message=cfg.limits.max_body_bytes,
            wire=WireEncoder(cfg.credentials()),
        )
        await _until_signal(server.serve())
    return 0


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
    Methods: acp.capabilities, session.start|message|cancel|close|permission,
    gemini.initialize, gemini.raw. Env: GEMINI_ADAPTER_AUTH_TOKEN,
    GEMINI_ADAPTER_ALLOWED_ORIGINS, GEMINI_ADAPTER_PROVIDER_ID|LABEL,
    GEMINI_ADAPTER_PROTOCOL_VERSION, GEMINI_ADAPTER_UPSTREAM_METHOD.
    With --config, a kind: stdio provider with that id in providers: supplies the label,
    command, env and cwd (flags, then env vars, replace the parts they name); agents.*
    (permissions, fs, terminal), allowed_roots and limits come from it too.
    """
    import os

    from xwm_bridge.adapters.agent_adapter import AdapterSettings
    from xwm_bridge.netaddr import is_loopback_host, parse_listen

    base = _load(config_file, log_level=log_level, log_format=log_format)
    try:
        settings = AdapterSettings.from_env(
            os.environ, listen=listen, agent_bin=agent_bin, agent_args=agent_args
        )
        host, port = parse_listen(settings.listen)
    except (ConfigError, ValueError) as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)
    cfg = settings.bridge_config(base)
    if not is_loopback_host(host) and not cfg.auth_token:
        _fail(
            f"refusing to listen on {settings.listen} without GEMINI_ADAPTER_AUTH_TOKEN",
            EXIT_CONFIG,
        )
    setup_logging(cfg.log_level, (*cfg.secrets(), settings.auth_token), log_format=cfg.log_format)
    sys.exit(_run(_serve(cfg, host, port, adapter=settings)))


cli.add_command(agent_adapter, name="gemini-adapter")


def _normalize_argv(argv: Sequence[str]) -> list[str]:
    return [("-" + a) if _SINGLE_DASH.match(a) else a for a in argv]


COMPLETE_VAR = "_XWM_BRIDGE_COMPLETE"
NO_COMMAND_NOTICE = (
    "xwm-bridge: no command given; running the MCP toolbridge on stdin/stdout "
    "(xwm-bridge --help lists the commands)"
)


def main(argv: Sequence[str] | None = None) -> None:
    args = _normalize_argv(sys.argv[1:] if argv is None else argv)
    if not args and not os.environ.get(COMPLETE_VAR):
        # the original runs the toolbridge when no mode is given (config.md §1); say so
        # on stderr (stdout carries the MCP protocol)
        click.echo(NO_COMMAND_NOTICE, err=True)
        args = ["toolbridge"]
    cli.main(args=args, prog_name="xwm-bridge", complete_var=COMPLETE_VAR)


# --- xwm-bridge client (issue 13) --------------------------------------------------------


@cli.group("client")
@click.option(
    "--url",
    metavar="URL",
    default=None,
    help="The bridge, e.g. http://127.0.0.1:8787 (default: the config's listen address).",
)
@CONFIG_OPTION
@click.pass_context
def client_group(ctx: click.Context, url: str | None, config_file: str | None) -> None:
    """A terminal client of a running bridge: list and watch sessions, run a turn,
    answer permission requests. Token: ACP_AUTH_TOKEN (else the config's auth_token)."""
    cfg = _load(config_file)
    from xwm_bridge.client import listen_url

    ctx.obj = (url or listen_url(cfg.listen), cfg.auth_token)


def _client_run(ctx: click.Context, main: Any) -> None:
    from xwm_bridge.client import Client, ClientError

    url, token = ctx.obj

    async def go() -> int:
        async with Client(url, token) as client:
            code: int = await main(client)
            return code

    try:
        code = asyncio.run(go())
    except ClientError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


@client_group.command("list")
@click.option(
    "--state", default=None, help="running, completed, failed, cancelled, interrupted, idle"
)
@click.option("--provider", default=None)
@click.option("--thread", "thread_id", default=None)
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the session.list result as JSON.")
@click.pass_context
def client_list(
    ctx: click.Context,
    state: str | None,
    provider: str | None,
    thread_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Sessions, newest first, with their last turn."""
    import orjson

    from xwm_bridge.client import Client, session_table

    params: dict[str, Any] = {"limit": limit}
    for key, value in (("state", state), ("provider", provider), ("threadId", thread_id)):
        if value:
            params[key] = value

    async def main(client: Client) -> int:
        result = await client.call("session.list", params)
        if as_json:
            click.echo(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        elif result["sessions"]:
            click.echo(session_table(result["sessions"]))
        else:
            click.echo("no sessions")
        return 0

    _client_run(ctx, main)


@client_group.command("watch")
@click.option("--since", default=None, help="Resume after this cursor (printed with --json).")
@click.option("--kinds", default=None, help="Comma-separated: session,turn,queue,health,permission")
@click.option("--count", type=int, default=0, help="Stop after this many events (0: never).")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line.")
@click.pass_context
def client_watch(
    ctx: click.Context, since: str | None, kinds: str | None, count: int, as_json: bool
) -> None:
    """Follow the live feed (bridge.watch) until interrupted."""
    import orjson

    from xwm_bridge.client import Client, event_line

    params: dict[str, Any] = {}
    if since:
        params["since"] = since
    if kinds:
        params["kinds"] = [k.strip() for k in kinds.split(",") if k.strip()]

    async def main(client: Client) -> int:
        seen = 0
        done = asyncio.Event()

        def on_note(msg: dict[str, Any]) -> None:
            nonlocal seen
            if msg.get("method") != "bridge.event":
                return
            event = msg.get("params") or {}
            if event.get("kind") == "watch":
                return
            line = orjson.dumps(event).decode() if as_json else event_line(event)
            if line:
                click.echo(line)
                seen += 1
            if count and seen >= count:
                done.set()

        client.on_notification = on_note
        while not done.is_set():
            # both owned here: awaited together, both cancelled (a no-op once done) after
            watch = asyncio.ensure_future(client.call("bridge.watch", params, wait_s=None))
            stop = asyncio.ensure_future(done.wait())
            try:
                finished, _ = await asyncio.wait({watch, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watch.cancel()
                stop.cancel()
            if watch in finished:
                params["since"] = watch.result().get("cursor")
        return 0

    _client_run(ctx, main)


@client_group.command("run")
@click.option("--provider", required=True, help="Provider id (see acp.capabilities).")
@click.option("--session", "session_id", default=None, help="Session id (default: a new one).")
@click.option("--thread", "thread_id", default=None)
@click.option("--cwd", "working_directory", default=None, help="The turn's working directory.")
@click.argument("prompt")
@click.pass_context
def client_run(
    ctx: click.Context,
    provider: str,
    session_id: str | None,
    thread_id: str | None,
    working_directory: str | None,
    prompt: str,
) -> None:
    """Run one turn: output on stdout, a progress line and permission prompts on stderr.
    Exits 0 when the turn succeeds, 1 when it fails, 130 when interrupted."""
    import uuid

    from xwm_bridge.client import Client, run_turn, stdin_lines

    sid = session_id or f"cli-{uuid.uuid4().hex[:12]}"
    params: dict[str, Any] = {
        "sessionId": sid,
        "taskPrompt": prompt,
        "routing": {
            "routingMode": "explicit",
            "explicitExecutionTarget": "singleAgent",
            "explicitProviderId": provider,
        },
    }
    if thread_id:
        params["threadId"] = thread_id
    if working_directory:
        params["workingDirectory"] = working_directory

    async def main(client: Client) -> int:
        try:
            result = await run_turn(client, params, sys.stdout, sys.stderr, stdin_lines())
        except asyncio.CancelledError:
            await client.call("session.cancel", {"sessionId": sid})
            raise
        return 0 if result.get("success") else 1

    _client_run(ctx, main)


@client_group.command("approve")
@click.argument("request_id")
@click.argument("option_id")
@click.pass_context
def client_approve(ctx: click.Context, request_id: str, option_id: str) -> None:
    """Answer a pending permission request (ids from `client watch` or the console)."""
    from xwm_bridge.client import Client, ClientError

    async def main(client: Client) -> int:
        listed = await client.call("permission.list", {})
        match = [r for r in listed["requests"] if r["requestId"] == request_id]
        if not match:
            raise ClientError(f"no pending permission request {request_id}")
        result = await client.call(
            "session.permission",
            {"sessionId": match[0]["sessionId"], "requestId": request_id, "optionId": option_id},
        )
        click.echo(f"{request_id}: {result.get('outcome') or option_id}")
        return 0

    _client_run(ctx, main)
