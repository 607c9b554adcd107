"""A small forward proxy on 127.0.0.1 for tests: CONNECT tunnels and absolute-form
requests (any method), relayed to the real target; it records what it saw.

``refuse`` answers every request with that status instead; ``hang`` reads the request
and never answers (a proxy that does not answer CONNECT).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]


@dataclass
class ForwardProxy:
    refuse: int = 0
    hang: bool = False
    seen: list[Seen] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        self.seen.append(Seen(method, target, headers))
        self.arrived.set()
        if self.hang:
            await asyncio.Event().wait()
        if self.refuse:
            writer.write(f"HTTP/1.1 {self.refuse} No\r\nContent-Length: 0\r\n\r\n".encode())
            await writer.drain()
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
        else:
            parts = urlsplit(target)
            assert parts.scheme == "http" and parts.hostname, target
            up_reader, up_writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            kept = [line for line in lines[1:] if not line.lower().startswith("proxy-")]
            up_writer.write(f"{method} {path} HTTP/1.1\r\n".encode() + "\r\n".join(kept).encode())
        await _pipe_both(reader, writer, up_reader, up_writer)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
