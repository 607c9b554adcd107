"""A small HTTP/1.1 client for upstream calls: pooled keep-alive connections, one POST
with a bytes body, the response's status and headers, its body read whole or streamed.

Why not aiohttp's ``ClientSession`` here: a forwarded turn is one POST and one
answer, and the session's generality (cookies, redirects, proxies, auto headers,
tracing, per-read timers) cost about a quarter of the daemon's CPU per turn
(performance.md). This client writes one pre-built request with one ``write``
and parses the answer with ``httptools`` (llhttp, the parser aiohttp itself
uses); a plain-JSON answer costs one future and a few parser callbacks.

Deadlines: ``connect_timeout`` for the TCP (and TLS) handshake, ``read_timeout``
for the longest silence while waiting for response bytes. The read deadline's timer
is one per connection, kept from wait to wait (and from exchange to exchange) and
re-armed only when it fires early or a wait needs an earlier deadline: arming and
cancelling a timer per wait cost about 2 µs each on uvloop, two waits per turn.
The caller bounds the whole call (``total_timeout``).
A cancelled call closes its connection, so the upstream sees the client leave.
A pooled connection the server closed while idle is detected before use; a
reused connection that ends before any response byte is retried once on a
fresh one (the request never reached a live server).

A reader may stop before the body's end (an SSE answer whose last event was
read before the chunked terminator arrived): :meth:`Response.release` pools the
connection as soon as the rest (at most ``drain_cap`` bytes, discarded) has
arrived, within ``drain_timeout``, without a task: the parser's callbacks do it.

The pool and the POST of a call are ``http1_pool.py``'s; this module knows it only as
a :class:`Pool` (what a :class:`Response` gives its connection back to).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

from xwm_bridge.codings import announced, transfer_refusal
from xwm_bridge.proxy import ProxyRoute, ProxySettings

MAX_HEAD_BYTES = 64 * 1024
#: above this many unread body bytes the socket stops reading (back-pressure)
HIGH_WATER = 1024 * 1024


class Http1Error(Exception):
    """A failed exchange. ``kind``: ``connect``, ``transport`` (the connection broke),
    ``protocol`` (not HTTP/1.x), ``timeout`` (read or connect deadline)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``http(s)://host:port/path`` URL, and its request line + Host header.

    ``proxy``: the forward proxy it goes through (decided once, when the target is
    parsed): an ``http://`` target is sent to the proxy in absolute form, an
    ``https://`` one through a CONNECT tunnel (``http1_pool.py``)."""

    url: str
    tls: bool
    host: str
    port: int
    path: str
    proxy: ProxyRoute | None = None

    @classmethod
    def parse(cls, url: str, proxies: ProxySettings | None = None) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url}")
        tls = parts.scheme == "https"
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        port = parts.port or (443 if tls else 80)
        proxy = proxies.route(tls, parts.hostname, port) if proxies is not None else None
        return cls(url, tls, parts.hostname, port, path, proxy)

    @property
    def origin(self) -> tuple[bool, str, int]:
        return (self.tls, self.host, self.port)

    def head(self, headers: dict[str, str]) -> bytes:
        """Request line and headers up to (not including) the Content-Length value."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls else 80
        hostport = host if self.port == default else f"{host}:{self.port}"
        proxy = self.proxy
        if proxy is not None and not self.tls:  # absolute form, to the proxy
            lines = [f"POST http://{hostport}{self.path} HTTP/1.1", f"Host: {hostport}"]
            if proxy.authorization:
                lines.append(f"Proxy-Authorization: {proxy.authorization}")
        else:
            lines = [f"POST {self.path} HTTP/1.1", f"Host: {hostport}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        for line in lines:
            if "\r" in line or "\n" in line:
                raise ValueError("header values must not contain line breaks")
        return ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")


class Connection(asyncio.Protocol):
    """One socket and its response parser; serves one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        #: while the rest of a released answer is discarded: called once it has ended
        self._on_drained: Callable[[], None] | None = None
        self._drain_left = 0
        self._drain_timer: asyncio.TimerHandle | None = None
        #: the read deadline's timer (see the module doc): armed for ``_read_at``, it
        #: checks the wait in progress then, if any, against ``_wait_deadline``
        self._read_timer: asyncio.TimerHandle | None = None
        self._read_at = 0.0
        self._read_timeout = 0.0
        self._wait_deadline = 0.0
        self._reset_exchange()

    def _reset_exchange(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self._head_size = 0
        self._paused = False
        self.last_activity = self._loop.time()

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self.last_activity = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Http1Error("upstream switched protocols", "protocol"))
        except httptools.HttpParserError as exc:
            self._fail(Http1Error(f"invalid HTTP response: {exc}", "protocol"))
        else:
            self._wake()

    def eof_received(self) -> bool:
        self._on_close(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_close(exc)

    # --- httptools callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value)
        if self._head_size > MAX_HEAD_BYTES:
            raise httptools.HttpParserError("response headers too large")
        name = name.lower()
        if name == b"transfer-encoding" and name in self.headers:
            value = self.headers[name] + b"," + value  # one list (RFC 9110 §5.3)
        self.headers[name] = value

    def on_headers_complete(self) -> None:
        coding = self.headers.get(b"transfer-encoding")
        if coding is not None and transfer_refusal(coding.decode("latin-1")):
            shown = coding[:100].decode("latin-1")  # never decoded: not the body it says
            error = f"upstream answered with Transfer-Encoding: {shown}; only chunked is taken"
            self._fail(Http1Error(error, "protocol"))
            raise httptools.HttpParserError(error)
        self.status = self._parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        if self._on_drained is not None:
            self._drain_left -= len(body)
            if self._drain_left < 0:
                self.abort()  # too much left: not worth keeping
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.keep_alive = self._parser.should_keep_alive()
        self.complete = True
        self._end_drain()

    # --- the exchange ---------------------------------------------------------------------

    def _on_close(self, exc: Exception | None) -> None:
        self._stop_read_timer()
        if self.closed and self.transport is None:
            return
        was_closed, self.closed = self.closed, True
        self.transport = None
        if was_closed and self._error is not None:
            return
        if self.head_done and not self.complete and self._reads_to_eof():
            self.complete, self.keep_alive = True, False  # the body ended with the connection
        if not self.complete and self._error is None:
            detail = f": {exc}" if exc else ""
            self._error = Http1Error(f"connection closed by the upstream{detail}", "transport")
        self._wake()
        self._end_drain()

    def _reads_to_eof(self) -> bool:
        """An answer with neither Content-Length nor chunked encoding lasts until EOF
        (any other ``Transfer-Encoding`` failed the exchange at its head)."""
        return b"content-length" not in self.headers and b"transfer-encoding" not in self.headers

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self.abort()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, read_timeout: float) -> None:
        """Until more has arrived (or the exchange failed, or the connection ended);
        :class:`Http1Error` (``timeout``) after ``read_timeout`` seconds without."""
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        deadline = self._wait_deadline = self._loop.time() + read_timeout
        self._read_timeout = read_timeout
        timer = self._read_timer
        if timer is None or self._read_at > deadline:  # else it fires first, re-arms
            if timer is not None:
                timer.cancel()
            self._arm_read(deadline)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._error is not None:
            raise self._error

    def _arm_read(self, when: float) -> None:
        self._read_at = when
        self._read_timer = self._loop.call_at(when, self._check_read)

    def _check_read(self) -> None:
        self._read_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():  # no wait now: the next one arms it again
            return
        read_timeout = self._read_timeout
        silent_until = max(self._wait_deadline, self.last_activity + read_timeout)
        if self._loop.time() >= silent_until:
            waiter.set_exception(
                Http1Error(f"no data from upstream for {read_timeout:g}s (read timeout)", "timeout")
            )
        else:
            self._arm_read(silent_until)

    def _stop_read_timer(self) -> None:
        timer, self._read_timer = self._read_timer, None
        if timer is not None:
            timer.cancel()

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset_exchange()
        self._error = None
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True
        self._stop_read_timer()
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.abort()
        self._end_drain()

    def drain(self, cap: int, timeout: float, done: Callable[[], None]) -> None:
        """Discard the rest of this answer; ``done()`` once it has ended, the connection
        has closed, or (then closed) more than ``cap`` bytes or ``timeout`` seconds passed."""
        self._drain_left = cap - self.buffered
        self.chunks.clear()
        self.buffered = 0
        self._on_drained = done
        if self._drain_left < 0 or self.closed:
            self.abort()
            return
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._drain_timer = self._loop.call_later(timeout, self.abort)

    def _end_drain(self) -> None:
        done, self._on_drained = self._on_drained, None
        if done is None:
            return
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None
        done()


class Pool(Protocol):
    """Where a :class:`Response` gives its connection back (``http1_pool.Http1Pool``)."""

    def release(self, origin: tuple[bool, str, int], conn: Connection) -> None: ...

    def drain(self, origin: tuple[bool, str, int], conn: Connection) -> None: ...


class Response:
    """An answer being received; its connection goes back to the pool when it is read."""

    def __init__(
        self,
        pool: Pool,
        origin: tuple[bool, str, int],
        conn: Connection,
        read_timeout: float,
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._conn = conn
        self._read_timeout = read_timeout
        self.status = conn.status
        self._headers = conn.headers
        self._done = False

    def header(self, name: bytes) -> str:
        return self._headers.get(name, b"").decode("latin-1")

    @property
    def content_type(self) -> str:
        return self.header(b"content-type").split(";", 1)[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        length = announced(self.header(b"content-length") or None)  # not int(): 4300 digits
        return None if length < 0 else length

    async def read(self, cap: int) -> bytes:
        """The whole body; :class:`Http1Error` (``protocol``) past ``cap`` bytes."""
        conn = self._conn
        length = self.content_length
        if length is not None and length > cap:
            self.close()
            raise Http1Error("upstream response too large", "protocol")
        parts: list[bytes] = []
        size = 0
        while True:
            if conn.chunks:
                data = conn.take()
                size += len(data)
                if size > cap:
                    self.close()
                    raise Http1Error("upstream response too large", "protocol")
                parts.append(data)
            if conn.complete:
                self._finish()
                return parts[0] if len(parts) == 1 else b"".join(parts)
            await self._wait()

    async def chunk(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some), or
        ``b""`` once the message is complete."""
        conn = self._conn
        while True:
            if conn.chunks:
                return conn.take()
            if conn.complete:
                self._finish()
                return b""
            await self._wait()

    async def stream(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive, until the message is complete."""
        while chunk := await self.chunk():
            yield chunk

    async def _wait(self) -> None:
        try:
            await self._conn.wait(self._read_timeout)
        except BaseException:
            self.close()
            raise

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._pool.release(self._origin, self._conn)

    def close(self) -> None:
        """Give up on the answer (a cancelled or failed call): the connection is closed."""
        if not self._done:
            self._done = True
            self._conn.abort()
            self._pool.release(self._origin, self._conn)

    def release(self) -> None:
        """Done reading, maybe before the end: the connection is pooled now if the
        answer is complete, else once its rest has arrived (see the module doc)."""
        if self._done:
            return
        if self._conn.complete:
            self._finish()
            return
        self._done = True
        self._pool.drain(self._origin, self._conn)
