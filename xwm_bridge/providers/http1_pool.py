"""The upstream client's connection pool: keep-alive connections per origin, bounded,
and the POST of one call (connect, send, retry once on a stale pooled connection).

The connection, its answer and the request's bytes are ``http1.py``'s (see there for
the deadlines and the drain of an answer released early).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque

from xwm_bridge.providers.http1 import Connection, Http1Error, Response, Target
from xwm_bridge.providers.tunnel import open_via_proxy

IDLE_TIMEOUT = 30.0
MAX_IDLE_PER_ORIGIN = 128
MAX_CONNECTIONS = 512
#: how long, and how many bytes, a released answer's rest may take to arrive
DRAIN_TIMEOUT = 1.0
DRAIN_CAP = 64 * 1024


class Http1Pool:
    """Keep-alive connections per origin (scheme, host, port)."""

    def __init__(
        self,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        max_idle_per_origin: int = MAX_IDLE_PER_ORIGIN,
        max_connections: int = MAX_CONNECTIONS,
        drain_timeout: float = DRAIN_TIMEOUT,
        drain_cap: int = DRAIN_CAP,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        #: exchanges in flight (each holds one connection); more wait for a slot
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[tuple[bool, str, int], deque[Connection]] = {}
        self._idle_timeout = idle_timeout
        self._max_idle = max_idle_per_origin
        self._drain_timeout = drain_timeout
        self._drain_cap = drain_cap
        self._draining: set[Connection] = set()
        self._ssl = ssl_context
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def idle_count(self) -> int:
        return sum(len(q) for q in self._idle.values())

    def _take_idle(self, origin: tuple[bool, str, int]) -> Connection | None:
        queue = self._idle.get(origin)
        if not queue:
            return None
        horizon = time.monotonic() - self._idle_timeout
        while queue:
            conn = queue.pop()  # most recently used first: the warmest
            if not conn.closed and conn.idle_since > horizon:
                return conn
            conn.abort()
        return None

    def release(self, origin: tuple[bool, str, int], conn: Connection) -> None:
        """An exchange is over: its slot frees, its connection is pooled or closed."""
        self._slots.release()
        if self._closed or conn.closed or not conn.keep_alive:
            conn.abort()
            return
        queue = self._idle.setdefault(origin, deque())
        # the oldest idle connections go first when the origin has too many
        while len(queue) >= self._max_idle:
            queue.popleft().abort()
        conn.reused = True
        conn.idle_since = time.monotonic()
        queue.append(conn)

    def drain(self, origin: tuple[bool, str, int], conn: Connection) -> None:
        """Keep ``conn``'s slot until its answer's rest is discarded, then release it."""
        self._draining.add(conn)

        def drained() -> None:
            self._draining.discard(conn)
            self.release(origin, conn)

        conn.drain(self._drain_cap, self._drain_timeout, drained)

    async def _connect(self, target: Target, connect_timeout: float) -> Connection:
        loop = asyncio.get_running_loop()
        proxy = target.proxy
        try:
            async with asyncio.timeout(connect_timeout):
                if proxy is not None:  # proxy connect, CONNECT answer, TLS: one deadline
                    tls = self._ssl_context if target.tls else None
                    return await open_via_proxy(proxy, target.host, target.port, tls)
                _, conn = await loop.create_connection(
                    lambda: Connection(loop),
                    target.host,
                    target.port,
                    ssl=self._ssl_context() if target.tls else None,
                    server_hostname=target.host if target.tls else None,
                )
        except TimeoutError:
            via = f" via proxy {proxy.address}" if proxy is not None else ""
            raise Http1Error(
                f"cannot connect to {target.host}:{target.port}{via}: timed out after "
                f"{connect_timeout:g}s",
                "timeout",
            ) from None
        except (OSError, ssl.SSLError) as exc:
            raise Http1Error(
                f"cannot connect to {target.host}:{target.port}: {exc.strerror or exc}"
                if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError)
                else f"TLS handshake with {target.host}:{target.port} failed: {exc}",
                "connect",
            ) from None
        return conn

    async def post(
        self,
        target: Target,
        head: bytes,
        body: bytes,
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> Response:
        """Send ``head`` (from :meth:`Target.head`) + Content-Length + ``body``; return
        once the response's status and headers have arrived."""
        if self._closed:
            raise Http1Error("the upstream client is closed", "transport")
        request = b"%s%d\r\n\r\n%s" % (head, len(body), body)
        origin = target.origin
        await self._slots.acquire()
        try:
            return await self._exchange(target, origin, request, connect_timeout, read_timeout)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(
        self,
        target: Target,
        origin: tuple[bool, str, int],
        request: bytes,
        connect_timeout: float,
        read_timeout: float,
    ) -> Response:
        for attempt in (0, 1):
            conn = self._take_idle(origin) if attempt == 0 else None
            if conn is None:
                conn = await self._connect(target, connect_timeout)
            conn.send(request)
            try:
                while not conn.head_done:
                    await conn.wait(read_timeout)
            except Http1Error as exc:
                conn.abort()
                if attempt == 0 and conn.reused and not conn.got_bytes and exc.kind == "transport":
                    continue  # the server had closed this idle connection: once more, fresh
                raise
            except BaseException:
                conn.abort()  # cancelled: the upstream sees us leave
                raise
            return Response(self, origin, conn, read_timeout)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._draining):
            conn.abort()
        for queue in self._idle.values():
            while queue:
                queue.pop().abort()
        self._idle.clear()
