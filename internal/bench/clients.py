"""The load generator's connections: raw HTTP/1.1, aiohttp, and WebSocket clients.

Each client sends one request at a time (the load generator's workers are
closed-loop) on one keep-alive connection, opened on first use and reopened
after an error (``aiohttp``: from its session's pool). ``post`` returns the
status and the whole body; ``post_stream`` feeds the body, piece by piece as
it arrives, to a :class:`~internal.bench.streamed.StreamTimer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import orjson
import websockets
from websockets.asyncio.client import ClientConnection, connect

from internal.bench.streamed import StreamTimer


class ProtocolError(Exception):
    pass


class Client(Protocol):
    async def post(self, body: bytes) -> tuple[int, bytes]: ...

    async def post_stream(self, body: bytes, timer: StreamTimer) -> int:
        """POST, feed the body to ``timer`` piece by piece as it arrives; the status."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Head:
    """What the load generator needs of a response head."""

    status: int
    #: Content-Length, or -1 for a chunked body
    length: int
    chunked: bool
    close: bool


async def read_head(reader: asyncio.StreamReader) -> Head:
    """Read an HTTP/1.1 response head up to its blank line."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or len(head) < 12 or not head[9:12].isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {head[:80]!r}")
    length = -1
    chunked = close = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            close = b"close" in value.lower()
    if not chunked and length < 0:
        raise ProtocolError("response has neither Content-Length nor chunked body")
    return Head(int(head[9:12]), -1 if chunked else length, chunked, close)


async def read_body(
    reader: asyncio.StreamReader, head: Head, sink: Callable[[bytes], None]
) -> None:
    """Hand the body to ``sink``: whole, or one call per chunk as each arrives."""
    if not head.chunked:
        sink(await reader.readexactly(head.length))
        return
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers expected
            return
        sink(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")


class RawHttpClient:
    """One keep-alive HTTP/1.1 connection that POSTs to one path."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _exchange(self, body: bytes, sink: Callable[[bytes], None]) -> int:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._reader, self._writer
        try:
            writer.write(self._head + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await read_head(reader)
            await read_body(reader, head, sink)
        except BaseException:
            await self.close()
            raise
        if head.close:
            await self.close()
        return head.status

    async def post(self, body: bytes) -> tuple[int, bytes]:
        parts: list[bytes] = []
        status = await self._exchange(body, parts.append)
        return status, b"".join(parts)

    async def post_stream(self, body: bytes, timer: StreamTimer) -> int:
        clock = time.perf_counter
        status = await self._exchange(body, lambda chunk: timer.feed(chunk, clock()))
        timer.close(clock())
        return status

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()


class AiohttpClient:
    def __init__(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str]):
        self._session = session
        self._url = url
        self._headers = headers

    async def post(self, body: bytes) -> tuple[int, bytes]:
        async with self._session.post(self._url, data=body, headers=self._headers) as resp:
            return resp.status, await resp.read()

    async def post_stream(self, body: bytes, timer: StreamTimer) -> int:
        async with self._session.post(self._url, data=body, headers=self._headers) as resp:
            async for chunk in resp.content.iter_any():
                timer.feed(chunk, time.perf_counter())
            timer.close(time.perf_counter())
            return resp.status

    async def close(self) -> None:
        return None


class WsClient:
    """One WebSocket; each request is sent and its answer awaited (closed loop).

    Notifications that arrive meanwhile are skipped; the answer must carry the
    request's id. No compression, no client pings (the cells are short).
    """

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self._url = url
        self._headers = headers
        self._ws: ClientConnection | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        want = orjson.loads(body).get("id")
        try:
            if self._ws is None:
                self._ws = await connect(
                    self._url,
                    additional_headers=self._headers,
                    compression=None,
                    proxy=None,
                    ping_interval=None,
                    open_timeout=10,
                    close_timeout=2,
                    max_size=16 * 1024 * 1024,
                )
            ws = self._ws
            await ws.send(body.decode())  # a text frame, as JSON-RPC clients send
            while True:
                frame = await ws.recv()
                data = frame.encode() if isinstance(frame, str) else frame
                obj = orjson.loads(data)
                if isinstance(obj, dict) and "method" in obj and "id" not in obj:
                    continue  # a notification, not our answer
                if not isinstance(obj, dict) or obj.get("id") != want:
                    raise ProtocolError(f"answer for another request: {data[:200]!r}")
                return 200, data
        except BaseException:
            await self.close()
            raise

    async def post_stream(self, body: bytes, timer: StreamTimer) -> int:
        raise ProtocolError("streamed turns are measured over HTTP (SSE) only")

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(OSError, websockets.WebSocketException):
                await ws.close()
