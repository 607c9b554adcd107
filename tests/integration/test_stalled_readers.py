"""A client that stops reading while its answer is still being written: once its
writes have stayed paused for ``limits.notification_send_timeout``, the connection is
aborted. Closing it was not enough: the bytes still buffered for it kept the socket,
its per-address slot and (on aiohttp's connections) its handler waiting for good."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    StartBridge,
    eventually,
    provider_env,
    session_params,
    wait_until,
)

WITHIN = 10.0
#: more than the kernel's send and receive buffers (4 MiB at most here) hold
PROMPT = "x" * (5 * 1024 * 1024)


async def stalled_connection(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a tiny receive window: an unread answer backs up at once."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), 5)
    return await asyncio.open_connection(sock=sock)


async def admitted(port: int) -> bool:
    """A new connection from this address is served (the per-address slot is free)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
    try:
        writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(5):
            with contextlib.suppress(ConnectionError):
                return (await reader.readline()).startswith(b"HTTP/1.1 200 ")
        return False
    finally:
        writer.close()


async def answered_livez(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A first request on another route: aiohttp owns the connection from then on."""
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)


def turn_request(session_id: str, accept: str) -> bytes:
    params = session_params(session_id, PROMPT)
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.start", "params": params})
    head = (
        f"POST /acp/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Accept: {accept}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@pytest.mark.parametrize("accept", ["text/event-stream", "application/json"])
@pytest.mark.parametrize("owner", ["front", "aiohttp"])
async def test_a_client_that_stops_reading_its_answer_is_dropped(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    owner: str,
    accept: str,
) -> None:
    limits = {
        "notification_send_timeout": 0.3,
        "max_body_bytes": 16 * 1024 * 1024,
        "max_connections_per_address": 1,
        "keepalive_timeout": 0.5,
    }
    bridge = await start_bridge(
        env=provider_env(fake_upstream.url), config={"limits": limits}, tmp=tmp_path
    )
    reader, writer = await stalled_connection(bridge.port)
    try:
        if owner == "aiohttp":
            await answered_livez(reader, writer)
        writer.write(turn_request(f"stalled-{owner}", accept))
        await writer.drain()
        # the turn ends, its answer backs up unread, and the connection's slot comes back
        await wait_until(lambda: fake_upstream.state.completed >= 1, within=WITHIN)
        await eventually(lambda: admitted(bridge.port), within=WITHIN)
    finally:
        writer.close()
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    assert 'xwm_connections_closed_total{reason="send_timeout"} 1.0' in text
