"""A stand-in for the parts of a ``GatewayRuntime`` a gateway turn uses: its taps, its
socket-lost future, its settings and snapshot, and its ``chat.abort`` (the runtime's own,
through ``request``, which each test's subclass defines)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from xwm_bridge.config.sections import GatewayConfig
from xwm_bridge.gateway.runtime import GatewayRuntime
from xwm_bridge.gateway.turns import RunTap


class TapRuntime:
    runtime_id = "rt-test"
    #: the runtime's own: its ``chat.abort`` goes through :meth:`request`
    abort_run = GatewayRuntime.abort_run

    def __init__(self, settings: GatewayConfig) -> None:
        self.settings = settings
        self.snapshot = SimpleNamespace(main_session_key="agent:main:main")
        self.taps: list[RunTap] = []
        self.socket_lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def add_tap(self, tap: RunTap) -> None:
        self.taps.append(tap)

    def remove_tap(self, tap: RunTap) -> None:
        self.taps.remove(tap)
