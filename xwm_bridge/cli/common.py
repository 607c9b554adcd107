"""What every command shares: exit codes, the common click options, config loading,
the event loop runner and the SIGTERM/SIGINT handling of the long-running modes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn

import click

from xwm_bridge.config import (
    CONFIG_FILE_ENV,
    LOG_FORMATS,
    LOG_LEVELS,
    BridgeConfig,
    ConfigError,
    LoadedConfig,
    load_config,
)
from xwm_bridge.observability.logging import flush_logs, setup_logging
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.store.base import StoreError

if TYPE_CHECKING:  # imported lazily at run time (``--help`` stays fast)
    from xwm_bridge.app.bridge import Bridge

log = logging.getLogger("xwm_bridge")

EXIT_CONFIG = 2
EXIT_LISTEN = 1
#: a second SIGTERM/SIGINT cut the drain short
EXIT_FORCED = 1
FORCE_HINT = "send SIGTERM or SIGINT again to cancel running turns and exit now"

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


def _stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM, SIGINT, and SIGHUP unless it is ignored (``nohup``): the terminal of a
    foreground bridge closing killed it at once by the default action, its agents
    (each in its own session) left running and its queued store writes lost."""
    hup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGTERM, signal.SIGINT, *hup)


class Signals:
    """SIGTERM/SIGINT/SIGHUP: the first starts the shutdown (``on_first``) and says in
    the log that another one forces the exit; the second calls ``on_force`` (cancel
    running turns now); a third exits at once. Installed until :meth:`remove`."""

    def __init__(self, on_first: Callable[[], None], grace_s: float) -> None:
        self.on_first = on_first
        self.on_force: Callable[[], None] | None = None
        self.grace_s = grace_s
        self.count = 0
        self._loop = asyncio.get_running_loop()
        self._signals = _stop_signals()
        for sig in self._signals:
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
        for sig in self._signals:
            self._loop.remove_signal_handler(sig)


async def _until_signal(
    main: Coroutine[Any, Any, None],
    grace_s: float = 0.0,
    finish: Callable[[Signals], Awaitable[None]] | None = None,
    *,
    end_input: Callable[[], None] | None = None,
    drain: Callable[[], Coroutine[Any, Any, None]] | None = None,
    on_force: Callable[[], None] | None = None,
) -> bool:
    """Run a stdio server until it ends (end of input) or SIGTERM/SIGINT stops it, then
    ``finish`` with the signal handlers still installed, so a second signal forces the
    exit (``on_force``). True when a signal stopped it.

    With ``end_input`` the first signal ends the server's input, as the real end of
    input does, and runs ``drain`` (the bridge's: running turns get their grace, waiting
    ones are refused) beside it: the server answers the requests still running, and
    ends once they are done. Without, the server is cancelled (requests and all)."""
    async with asyncio.TaskGroup() as group:
        task = group.create_task(main, name="stdio-server")

        def stop() -> None:
            if end_input is None:
                task.cancel()
                return
            if task.done():  # the input had ended: ``finish`` runs the drain
                return
            end_input()
            if drain is not None:
                group.create_task(drain(), name="signal-drain")

        signals = Signals(stop, grace_s)
        signals.on_force = on_force
    try:
        if finish is not None:
            await finish(signals)
    finally:
        signals.remove()
    return signals.count > 0


def log_secrets(cfg: BridgeConfig) -> tuple[str, ...]:
    """What the log redactor masks: the config's secrets and the proxy credentials of
    the environment (load_config has refused a malformed proxy variable already)."""
    return (*cfg.secrets(), *ProxySettings.from_env(os.environ).secrets())


def _load(config_file: str | None, **flags: Any) -> LoadedConfig:
    try:
        return load_config(config_file=config_file, flags=flags)
    except ConfigError as exc:
        _fail(f"config error: {exc}", EXIT_CONFIG)


def start_logging(cfg: BridgeConfig, loaded: LoadedConfig, secrets: tuple[str, ...] = ()) -> None:
    """Logging as ``cfg`` says (masking its secrets and ``secrets``), then the warnings
    of the load: boolean variables not understood, whose default applied."""
    setup_logging(cfg.log_level, (*log_secrets(cfg), *secrets), log_format=cfg.log_format)
    for warning in loaded.warnings:
        log.warning(str(warning), extra={"variable": warning.variable})


async def _start_bridge(bridge: Bridge) -> bool:
    """Start ``bridge`` for a stdio mode; False (said on stderr, the bridge closed
    again) when its session store refused to open."""
    try:
        await bridge.start()
    except StoreError as exc:
        click.echo(f"xwm-bridge: {exc}", err=True)
        await bridge.close(0)
        return False
    return True
