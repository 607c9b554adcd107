"""The real daemon's HTTP app, run inside the test process on an ephemeral port.

:func:`start_in_process` builds exactly what ``xwm-bridge serve`` builds (config
from env + YAML + flags, the bridge, its method table, the aiohttp app whose
``cleanup_ctx`` starts and closes the bridge) and serves it with the daemon's own
``transport.serving.Server`` (the ``/acp/rpc`` front, aiohttp behind it). No
interpreter start-up, no stderr pipe: a daemon in about 50 ms
instead of about a second. Tests that need a separate process (signals,
``kill -9``, exit codes, two daemons on one state directory) use
``start_bridge_process``.

While it runs, ``os.environ`` is the daemon's environment (as it would be for
the process), so stdio agents and memory lookups see the same variables.
Log lines are captured from the shared line sink into :attr:`logs`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.app.methods import BridgeMethods
from xwm_bridge.config import load_config
from xwm_bridge.observability import logging as obslog
from xwm_bridge.transport.http import HttpTransport
from xwm_bridge.transport.serving import Server


class NeedsProcess(Exception):
    """These arguments only make sense for a real process."""


def parse_flags(args: tuple[str, ...]) -> tuple[str | None, dict[str, Any]]:
    """``serve`` flags the in-process daemon understands → (config file, flags)."""
    config_file: str | None = None
    flags: dict[str, Any] = {}
    it = iter(args)
    for arg in it:
        name, eq, value = arg.partition("=")
        if name == "--config":
            config_file = value if eq else next(it)
        elif name == "--log-level":
            flags["log_level"] = value if eq else next(it)
        elif name == "--allow-unauthenticated":
            flags["allow_unauthenticated"] = True
        else:
            raise NeedsProcess(arg)
    return config_file, flags


class LogCapture:
    """Every log line of the process, JSON as the daemon writes it, into lists.

    Several daemons may be attached at once: each list gets every line, redacted
    with the secrets of all of them, at the most verbose of their levels.
    """

    def __init__(self) -> None:
        self.targets: list[tuple[list[str], int, tuple[str, ...]]] = []
        self._sink: obslog.LineSink | None = None
        self._handler: obslog.SinkHandler | None = None
        self._level = logging.WARNING

    def _write(self, data: bytes) -> None:
        lines = data.decode(errors="replace").splitlines()
        for target, _, _ in self.targets:
            target.extend(lines)

    def _configure(self) -> None:
        assert self._sink is not None
        secrets = tuple(s for _, _, many in self.targets for s in many)
        level = min(level for _, level, _ in self.targets)
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
        self._handler = obslog.SinkHandler(self._sink, obslog.JsonFormatter(secrets))
        root = logging.getLogger()
        root.addHandler(self._handler)
        root.setLevel(level)
        obslog.events.configure(self._sink, obslog.Redactor(secrets), level)

    def attach(self, level: str, secrets: tuple[str, ...], target: list[str]) -> None:
        if self._sink is None:
            self._level = logging.getLogger().level
            self._sink = obslog.LineSink(self._write, flush_interval=0.005)
        self.targets.append((target, logging.getLevelName(level.upper()), secrets))
        self._configure()

    def flush(self) -> None:
        if self._sink is not None:
            self._sink.flush()

    def detach(self, target: list[str]) -> None:
        self.flush()
        self.targets = [t for t in self.targets if t[0] is not target]
        if self._sink is None:
            return
        if self.targets:
            self._configure()
            return
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
        root.setLevel(self._level)
        obslog.events.configure(None, obslog.Redactor(), logging.INFO)
        self._sink.close()
        self._sink = self._handler = None


CAPTURE = LogCapture()


class Environ:
    """``os.environ`` swapped for the daemon's while in-process daemons run."""

    def __init__(self) -> None:
        self.saved: dict[str, str] | None = None
        self.active: dict[str, str] | None = None
        self.users = 0

    def enter(self, env: dict[str, str]) -> None:
        if self.active is not None and self.active != env:
            raise NeedsProcess("another in-process daemon runs with a different environment")
        if self.saved is None:
            self.saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(env)
            self.active = dict(env)
        self.users += 1

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0 and self.saved is not None:
            os.environ.clear()
            os.environ.update(self.saved)
            self.saved = self.active = None


ENVIRON = Environ()


@dataclass
class InProcessBridge:
    server: Server
    port: int
    bridge: Bridge
    _logs: list[str] = field(default_factory=list)
    _stopped: bool = False
    on_stop: Callable[[], None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def rpc_url(self) -> str:
        return f"{self.url}/acp/rpc"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    @property
    def logs(self) -> list[str]:
        CAPTURE.flush()
        return self._logs

    async def stop(self, sig: int = 15, wait_s: float = 30) -> int:
        """Graceful shutdown, as SIGTERM does (drain, close sockets, close the bridge)."""
        if not self._stopped:
            self._stopped = True
            try:
                await self.server.close()
            finally:
                CAPTURE.detach(self._logs)
                if self.on_stop is not None:
                    self.on_stop()
        return 0


async def start_in_process(args: tuple[str, ...], env: dict[str, str]) -> InProcessBridge:
    config_file, flags = parse_flags(args)
    cfg = load_config(config_file=config_file, env=env, flags=flags).config
    ENVIRON.enter(env)
    logs: list[str] = []
    CAPTURE.attach(cfg.log_level, cfg.secrets(), logs)
    bridge = Bridge(cfg)
    transport = HttpTransport(bridge, Dispatcher(BridgeMethods(bridge).table(), bridge.metrics))
    server = Server(transport)
    try:
        await server.setup()
        try:
            port = await server.listen("127.0.0.1", 0)
        except BaseException:
            await server.close()
            raise
    except BaseException:
        CAPTURE.detach(logs)
        ENVIRON.leave()
        raise
    return InProcessBridge(server, port, bridge, logs, on_stop=ENVIRON.leave)
