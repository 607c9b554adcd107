"""The bytes of the front's answers, and the request it hands the method logic.

Sans I/O but for :class:`ChunkedStream`, which writes to its connection's
transport; the connection (``front.FrontProtocol``) is seen through :class:`Conn`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol

from xwm_bridge.transport.exchange import JSON_HEADERS, VARY, Reply, sse_headers

#: fields a request carries once: aiohttp answers a second one 400 (RFC 9110), so a
#: head that repeats one is handed to it (or, pipelined, closes the connection)
SINGLETONS = frozenset(
    {
        "content-length",
        "content-location",
        "content-range",
        "content-type",
        "etag",
        "host",
        "max-forwards",
        "server",
        "transfer-encoding",
        "user-agent",
    }
)


#: the lower-case key of each field name seen (:func:`field_key`), by the name's bytes
FIELD_KEYS: dict[bytes, str] = {}
#: names are the client's: the cache holds this many, of at most FIELD_KEY_BYTES each
MAX_FIELD_KEYS = 512
FIELD_KEY_BYTES = 64


def field_key(name: bytes) -> str:
    """The :class:`Headers` key of a field name: its text (``latin-1``: every byte is a
    character) in lower case. Remembered in :data:`FIELD_KEYS` (cleared when full), so
    the names a client sends on every request cost one dict lookup
    (``FIELD_KEYS.get(name) or field_key(name)``)."""
    key = name.decode("latin-1").lower()
    if len(name) <= FIELD_KEY_BYTES:
        if len(FIELD_KEYS) >= MAX_FIELD_KEYS:
            FIELD_KEYS.clear()
        FIELD_KEYS[name] = key
    return key


class Headers(dict[str, str]):
    """Request headers keyed by lower-case name; the first of repeated names wins."""

    __slots__ = ()

    def get(self, name: str, default: Any = None, /) -> Any:
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object, /) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Request:
    """One ``POST /acp/rpc`` parsed here (a :class:`RequestView`)."""

    __slots__ = ("body", "cors", "headers", "keep_alive", "remote", "reply", "size", "transport")
    method = "POST"
    path = "/acp/rpc"

    def __init__(self, headers: Headers, remote: str, transport: asyncio.Transport) -> None:
        self.headers = headers
        self.remote = remote
        self.transport = transport
        self.keep_alive = True
        self.body: list[bytes] = []
        self.size = 0  # of the body kept
        #: the answer already decided (a refusal), or None: ask the endpoint
        self.reply: Reply | None = None
        self.cors: dict[str, str] = {}


def _line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_STATUS = {s: _line(s) for s in (200, 400, 401, 403, 413, 431, 500)}


class Clock:
    """The ``Date`` header, formatted once a second."""

    __slots__ = ("_line", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def line(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"Date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


def _lines(headers: Mapping[str, str], cors: dict[str, str]) -> bytes:
    out = [f"{k}: {v}\r\n" for k, v in headers.items()]
    if cors:
        out += [f"{k}: {v}\r\n" for k, v in cors.items()]
        out += [f"Vary: {v}\r\n" for v in VARY]
    return "".join(out).encode("latin-1", "replace")


#: the lines of nearly every answer (a JSON reply without CORS), encoded once
_JSON_LINES = _lines(JSON_HEADERS, {})


def header_lines(headers: Mapping[str, str], cors: dict[str, str]) -> bytes:
    if headers is JSON_HEADERS and not cors:  # a constant: its lines never change
        return _JSON_LINES
    return _lines(headers, cors)


def status_line(status: int) -> bytes:
    return _STATUS.get(status) or _line(status)


class Conn(Protocol):
    """What a stream needs of its connection."""

    transport: asyncio.Transport | None
    lost: bool
    paused: bool
    close_after: bool

    @property
    def clock(self) -> Clock: ...

    def keep(self, request: Request) -> bool: ...

    def closed_by(self, request: Request) -> None: ...

    async def drain(self) -> None: ...


class ChunkedStream:
    """The SSE answer on a kept connection: chunked, the head with the first write."""

    __slots__ = ("conn", "ended", "request", "started")

    def __init__(self, conn: Conn, request: Request) -> None:
        self.conn = conn
        self.request = request
        self.started = False
        self.ended = False

    def _head(self) -> bytes:
        return b"".join(
            [
                _STATUS[200],
                header_lines(sse_headers(self.request.keep_alive), self.request.cors),
                b"Transfer-Encoding: chunked\r\n",
                self.conn.clock.line(),
                b"\r\n",
            ]
        )

    async def write(self, data: bytes, *, last: bool = False) -> None:
        conn = self.conn
        if self.ended or conn.lost or conn.transport is None or conn.transport.is_closing():
            raise ConnectionResetError("client connection closed")
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        if not self.started:
            self.started = True
            chunk = self._head() + chunk
        if last:  # the terminator in the same write: one syscall, not two
            self.ended = True
            chunk += b"0\r\n\r\n"
            if not conn.keep(self.request):
                conn.closed_by(self.request)
        conn.transport.write(chunk)
        if conn.paused:
            await conn.drain()

    async def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        conn = self.conn
        if conn.lost or conn.transport is None or conn.transport.is_closing():
            return
        tail = b"0\r\n\r\n"
        if not self.started:
            self.started = True
            tail = self._head() + tail
        if not conn.keep(self.request):
            conn.closed_by(self.request)
        conn.transport.write(tail)
