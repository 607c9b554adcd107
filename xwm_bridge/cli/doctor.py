"""``xwm-bridge doctor``: the effective config and a check of every configured component."""

from __future__ import annotations

import asyncio
import sys

import click

from xwm_bridge.cli.common import CONFIG_OPTION, EXIT_CONFIG, _fail
from xwm_bridge.cli.group import cli
from xwm_bridge.config import ConfigError, load_config


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
    configured (openclaw_url or openclaw_token set); the session store can be written;
    agents.permission_rules_file, when set, reads as a rule list.
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
    config, sources = masked_config(loaded)
    redactor = Redactor(loaded.config.secrets())  # a secret quoted in an error text, too
    if as_json:
        doc = {"config": config, "sources": sources, "checks": checks}
        click.echo(redactor.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(redactor.text(render_text(config, sources, checks)))
    sys.exit(0 if passed(checks) else 1)
