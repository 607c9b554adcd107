"""The front's server side: the protocol factory of the listening socket, the owner of
the connections it keeps, and what it needs of ``/acp/rpc`` (:class:`Endpoint`).

Each connection is a :class:`~xwm_bridge.transport.front.FrontProtocol` (see that
module for what stays here and what is handed to aiohttp); :meth:`Front.install`
ties the kept connections to aiohttp's server shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from xwm_bridge.transport.exchange import Reply, RequestView, StreamOut
from xwm_bridge.transport.front import FrontProtocol
from xwm_bridge.transport.front_wire import Clock
from xwm_bridge.transport.guard import ConnectionGuard


class Endpoint(Protocol):
    """What the front needs of ``/acp/rpc`` (``HttpTransport`` has it)."""

    def cors(self, request: RequestView) -> dict[str, str]:
        """The CORS headers of an answer; asked only for a request with an ``Origin``
        (an answer to one without has none)."""

    def denied(self, request: RequestView, transport: str = "http") -> Reply | None: ...

    def body_too_large(self, request: RequestView) -> Reply: ...

    def bad_body(self, request: RequestView) -> Reply: ...

    def bad_request(self, request: RequestView, reason: str, status: int) -> Reply: ...

    async def answer(
        self, request: RequestView, body: bytes, stream: StreamOut
    ) -> Reply | None: ...


class Front:
    """The protocol factory of the listening socket and the owner of its connections.

    ``fallback`` makes the aiohttp handler a connection is handed to (aiohttp's
    ``web.Server``); ``endpoint`` answers ``/acp/rpc``; limits as in
    ``config.Limits``: ``max_body`` bytes, ``body_timeout`` seconds for a body
    to arrive once its head has, ``keepalive_timeout`` seconds idle between
    requests.
    """

    def __init__(
        self,
        *,
        fallback: Callable[[], asyncio.Protocol],
        endpoint: Endpoint,
        guard: ConnectionGuard,
        max_body: int,
        body_timeout: float,
        keepalive_timeout: float,
    ) -> None:
        self.fallback = fallback
        self.endpoint = endpoint
        self.guard = guard
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.keepalive_timeout = keepalive_timeout
        self.clock = Clock()
        #: connections answered here (not those handed over: aiohttp owns them)
        self.kept: set[FrontProtocol] = set()
        #: connections handed to aiohttp before their first head was complete (a head
        #: over the front's 64 KiB, bytes its parser refused), by aiohttp's handler:
        #: the guard's header deadline ends when aiohttp has the head
        self.unfinished: dict[asyncio.Protocol, FrontProtocol] = {}
        self.closing = False

    def __call__(self) -> FrontProtocol:
        return FrontProtocol(self)

    def install(self, server: web.Server) -> None:
        """Shut kept connections down with aiohttp's own (``AppRunner.cleanup``), and
        end the header deadline of an :attr:`unfinished` connection at its head."""
        pre, shut, factory = server.pre_shutdown, server.shutdown, server.request_factory

        def request_factory(message: Any, payload: Any, protocol: Any, *rest: Any) -> Any:
            if self.unfinished:
                conn = self.unfinished.pop(protocol, None)
                if conn is not None:
                    self.guard.head(conn)
            return factory(message, payload, protocol, *rest)

        def pre_shutdown() -> None:
            self.pre_shutdown()
            pre()

        async def shutdown(timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
            await asyncio.gather(self.shutdown(timeout), shut(timeout))

        server.request_factory = request_factory
        server.pre_shutdown = pre_shutdown  # type: ignore[method-assign]
        server.shutdown = shutdown  # type: ignore[method-assign]

    def pre_shutdown(self) -> None:
        """Close idle kept connections; the others close after their current answer."""
        self.closing = True
        for conn in list(self.kept):
            conn.close_when_idle()

    async def shutdown(self, grace: float | None) -> None:
        """Wait up to ``grace`` seconds for answers in progress, then cancel and close."""
        conns = list(self.kept)
        busy = [c.task for c in conns if c.task is not None]
        if busy:
            await asyncio.wait(busy, timeout=grace)
        for conn in conns:
            conn.abort()
