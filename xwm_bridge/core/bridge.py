"""Composition root: builds the bridge core once per process and tears it down."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.dispatcher import Dispatcher
from xwm_bridge.core.executors import MultiAgentUnavailableExecutor
from xwm_bridge.core.queues import ThreadQueues
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.core.supervisor import Supervisor
from xwm_bridge.core.turns import TurnRunner
from xwm_bridge.gateway.manager import GatewayManager
from xwm_bridge.gateway.turns import GatewayTurnExecutor
from xwm_bridge.providers.single_agent import SingleAgentExecutor
from xwm_bridge.providers.upstream import UpstreamClient

log = logging.getLogger("xwm_bridge.bridge")


class Bridge:
    """Owns the sessions, thread queues, upstream client and background tasks."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self.supervisor = Supervisor()
        self.sessions = SessionRegistry()
        self.queues = ThreadQueues(self.supervisor, max_depth=config.limits.max_queue_depth)
        self._http: aiohttp.ClientSession | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._dispatcher: Dispatcher | None = None
        self.gateway = GatewayManager(config)
        self._gateway_reaper: asyncio.Task[None] | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        """The shared outbound HTTP client (connection pool)."""
        if self._http is None:
            raise RuntimeError("Bridge.start() has not been called")
        return self._http

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("Bridge.start() has not been called")
        return self._dispatcher

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, ttl_dns_cache=60)
        self._http = aiohttp.ClientSession(connector=connector, trust_env=False)
        upstream = UpstreamClient(self._http)
        runner = TurnRunner(
            self.config,
            self.sessions,
            self.supervisor,
            {
                "single-agent": SingleAgentExecutor(self.config, upstream),
                "multi-agent": MultiAgentUnavailableExecutor(),
                "gateway-chat": GatewayTurnExecutor(self.gateway),
            },
        )
        self._dispatcher = Dispatcher(
            self.config, self.sessions, self.queues, runner, self.supervisor, self.gateway
        )
        self._gateway_reaper = asyncio.get_running_loop().create_task(
            self.gateway.run_reaper(), name="gateway-reaper"
        )
        self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="session-reaper")

    async def _reap(self) -> None:
        ttl = self.config.limits.session_idle_ttl
        interval = max(0.05, min(ttl / 2, 30.0))
        while True:
            await asyncio.sleep(interval)
            reaped = self.sessions.reap(ttl)
            if reaped:
                log.debug("reaped idle sessions", extra={"count": reaped})

    async def close(self, grace: float | None = None) -> None:
        """Let running turns finish within ``grace`` seconds, cancel the rest, close upstreams."""
        for task in (self._reaper, self._gateway_reaper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.supervisor.shutdown(
            self.config.limits.shutdown_grace if grace is None else grace
        )
        await self.gateway.close()
        if self._http is not None:
            await self._http.close()
