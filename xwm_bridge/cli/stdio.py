"""The stdio modes: ``xwm-bridge acp-stdio`` (the bridge contract) and ``xwm-bridge acp``
(the bridge as an ACP agent)."""

from __future__ import annotations

import sys

from xwm_bridge.cli.common import (
    CONFIG_OPTION,
    EXIT_CONFIG,
    EXIT_FORCED,
    LOG_FORMAT_OPTION,
    LOG_LEVEL_OPTION,
    Signals,
    _load,
    _run,
    _start_bridge,
    _until_signal,
    start_logging,
)
from xwm_bridge.cli.group import cli
from xwm_bridge.config import BridgeConfig
from xwm_bridge.wire import WireEncoder


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
    On SIGTERM/SIGINT it stops reading and running turns get limits.shutdown_grace
    (their answers are written); a second signal cancels them and exits 1.
    """
    loaded = _load(config_file, log_level=log_level, log_format=log_format)
    cfg = loaded.config
    start_logging(cfg, loaded)
    sys.exit(_run(_acp_stdio(cfg)))


async def _acp_stdio(cfg: BridgeConfig) -> int:
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.dispatcher import Dispatcher
    from xwm_bridge.app.methods import BridgeMethods
    from xwm_bridge.transport.stdio import StdinInput, StdioServer, stdout_writer

    bridge = Bridge(cfg)
    if not await _start_bridge(bridge):
        return EXIT_CONFIG
    try:
        stdin = StdinInput()
        server = StdioServer(
            Dispatcher(BridgeMethods(bridge).table(), bridge.metrics),
            stdin.read,
            stdout_writer(),
            max_message=cfg.limits.max_body_bytes,
            send_timeout=cfg.limits.notification_send_timeout,
            wire=WireEncoder(cfg.credentials()),
        )

        async def finish(signals: Signals) -> None:
            await bridge.close()

        # a signal ends the input and drains: the turns the drain lets finish are
        # answered (the server was cancelled, and their answers lost)
        await _until_signal(
            server.serve(),
            cfg.limits.shutdown_grace,
            finish,
            end_input=stdin.end,
            drain=bridge.drain,
            on_force=bridge.force_shutdown,
        )
    finally:
        await bridge.close()  # a no-op after finish; closes the store if serve() failed
    return EXIT_FORCED if bridge.forced else 0


@cli.command("acp")
@CONFIG_OPTION
@LOG_LEVEL_OPTION
@LOG_FORMAT_OPTION
def acp(config_file: str | None, log_level: str | None, log_format: str | None) -> None:
    """Be an ACP agent on stdin/stdout, for editors (Zed) and ACP clients.

    \b
    Agent Client Protocol v1, newline-delimited JSON-RPC. Each session/prompt is
    one bridge turn: routed (session config option "route": auto, a provider,
    multi-agent or a gateway; default acp.default_route), queued, cancellable
    (session/cancel), persisted (session/list, session/load, session/resume after
    a restart). A stdio agent's permission requests, and its fs/* and terminal/*
    when the client declares them, are relayed to the client. The client's
    mcpServers reach a stdio agent route whose provider has client_mcp_servers.
    Sessions are kept in <state dir>/acp unless store.state_dir (XWM_STATE_DIR)
    is set, apart from a serve daemon's. Logs go to stderr. Exits 0 at end of input.
    On SIGTERM/SIGINT it stops reading and running turns get limits.shutdown_grace
    (their answers are written); a second signal cancels them and exits 1.
    """
    from xwm_bridge.store import with_own_state_dir

    loaded = _load(config_file, log_level=log_level, log_format=log_format)
    cfg = with_own_state_dir(loaded.config, "acp")
    start_logging(cfg, loaded)
    sys.exit(_run(_acp(cfg)))


async def _acp(cfg: BridgeConfig) -> int:
    from xwm_bridge.acp.front import AcpFrontDoor
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.transport.acp_stdio import serve_acp_stdio
    from xwm_bridge.transport.stdio import StdinInput, stdout_writer

    bridge = Bridge(cfg)
    if not await _start_bridge(bridge):
        return EXIT_CONFIG
    front = AcpFrontDoor(bridge)
    stdin = StdinInput()

    async def finish(signals: Signals) -> None:
        # with the signal handlers still installed: a second signal cancels the running
        # turns (the drain's cleanup still runs); it killed the process outright, agents
        # and the store's queued writes left behind
        await front.close()
        # the requests had limits.shutdown_grace already: at end of input, and on a
        # signal (the drain ran beside the server's wait)
        await bridge.close(0.0)

    try:
        # a signal ends the input and drains: the prompts the drain lets finish are
        # answered (the server was cancelled, and their answers lost)
        await _until_signal(
            serve_acp_stdio(
                front,
                stdin.read,
                stdout_writer(),
                max_message=cfg.limits.max_body_bytes,
                send_timeout=cfg.limits.notification_send_timeout,
                grace=cfg.limits.shutdown_grace,
            ),
            cfg.limits.shutdown_grace,
            finish,
            end_input=stdin.end,
            drain=bridge.drain,
            on_force=bridge.force_shutdown,
        )
    finally:
        await front.close()  # no-ops after finish; close what a failed serve left
        await bridge.close(0.0)
    return EXIT_FORCED if bridge.forced else 0
