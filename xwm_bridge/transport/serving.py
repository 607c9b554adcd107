"""The HTTP server of ``serve`` and ``agent-adapter``: aiohttp's runner behind the front.

One function builds what both the daemon (``cli/serve.py``) and the in-process test
daemon run, so that tests exercise the server the daemon serves with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiohttp import web

from xwm_bridge.transport.front_server import Front
from xwm_bridge.transport.http import SERVE_PATHS, HttpTransport


class Server:
    """``await setup()`` (starts the bridge), ``await listen(host, port)``, ``await
    close()`` (stop listening, drain turns, close connections, close the bridge)."""

    def __init__(self, transport: HttpTransport, paths: Iterable[str] = SERVE_PATHS) -> None:
        paths = tuple(paths)
        limits = transport.bridge.config.limits
        self.transport = transport
        self.runner = web.AppRunner(
            transport.app(paths),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=limits.keepalive_timeout,
            shutdown_timeout=5.0,
            # A client that goes away abandons its request: a turn still waiting in its
            # thread queue is then skipped (a running turn keeps going), as on WebSocket.
            handler_cancellation=True,
        )
        self._answers_rpc = "/acp/rpc" in paths
        self.front: Front | None = None

    async def setup(self) -> None:
        """Start the application (and with it the bridge); raises what the bridge raises."""
        await self.runner.setup()
        server = self.runner.server
        assert server is not None
        limits = self.transport.bridge.config.limits
        if self._answers_rpc:
            self.front = Front(
                fallback=server,
                endpoint=self.transport,
                guard=self.transport.guard,
                max_body=limits.max_body_bytes,
                body_timeout=limits.request_read_timeout,
                keepalive_timeout=limits.keepalive_timeout,
            )
            self.front.install(server)
        else:
            self.transport.guard.install(server)  # header deadline, per-address cap

    async def listen(self, host: str | None, port: int) -> int:
        """Accept connections on ``host:port``; the port bound (``port`` 0: any)."""
        server = self.runner.server
        assert server is not None
        site = _Site(self.runner, self.front or server, host, port)
        await site.start()
        return site.port

    async def close(self) -> None:
        await self.runner.cleanup()


class _Site(web.TCPSite):
    """aiohttp's TCP site, accepting with ``factory`` (the front) instead of its server."""

    __slots__ = ("_factory",)

    def __init__(
        self,
        runner: web.AppRunner,
        factory: Front | web.Server,
        host: str | None,
        port: int,
    ) -> None:
        super().__init__(runner, host, port, reuse_address=True)
        self._factory = factory

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory,
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]
