"""The ``xwm-bridge`` click group; the command modules register their commands on it."""

from __future__ import annotations

import click

from xwm_bridge import __version__


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
