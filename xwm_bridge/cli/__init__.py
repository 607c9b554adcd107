"""Command line: ``xwm-bridge serve``, ``acp-stdio`` and ``toolbridge`` (the default).

The group is ``group.py``; each command lives in the module named for it (``serve``,
``stdio``: acp-stdio and acp, ``doctor``, ``toolbridge``, ``adapter``: agent-adapter,
``client``: the client group), shared plumbing in ``common.py``. Importing them here
registers every command on the group.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

import click

# imported for their side effect: each registers its commands on the group
from xwm_bridge.cli import adapter, client, doctor, serve, stdio, toolbridge  # noqa: F401
from xwm_bridge.cli.group import cli

__all__ = ["cli", "main"]

# The original accepted Go-style single-dash flags (-listen ADDR, -listen=ADDR).
_SINGLE_DASH = re.compile(r"^-(listen|config|log-level|allow-unauthenticated)(=.*)?$")


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
