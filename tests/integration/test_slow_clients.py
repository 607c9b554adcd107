"""Slow and greedy clients against the real daemon, with raw sockets on 127.0.0.1
(issue 16 item 9): header and body deadlines, idle keep-alive close, a cap on
connections per client address. Counts are small and every wait is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.conftest import StartBridge

ASYNC_WAIT = 5.0


async def open_raw(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), ASYNC_WAIT)


async def read_until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sends until it closes the connection (fail after ``within``).
    A reset counts as closed: a server that closes with our unread bytes in its receive
    buffer sends RST, which may beat its last answer to us."""
    data = b""
    async with asyncio.timeout(within):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                data += chunk
    return data


async def trickle(writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
    """Send a never-ending request head, one byte every 50 ms (slowloris)."""
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(b"POST /acp/rpc HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        while not stop.is_set():
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(0.05)


def limits(**values: Any) -> dict[str, Any]:
    return {"limits": values}


async def still_serves(http: aiohttp.ClientSession, url: str) -> None:
    async with http.get(f"{url}/livez") as resp:
        assert resp.status == 200


async def test_a_trickled_request_head_is_cut_off(
    start_bridge_process: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bridge = await start_bridge_process(config=limits(header_read_timeout=0.5), tmp=tmp_path)
    stop = asyncio.Event()
    conns = [await open_raw(bridge.port) for _ in range(20)]
    trickles = [asyncio.create_task(trickle(w, stop)) for _, w in conns]
    started = time.monotonic()
    try:
        answers = await asyncio.gather(*(read_until_closed(r, ASYNC_WAIT) for r, _ in conns))
    finally:
        stop.set()
        await asyncio.gather(*trickles)
        for _, writer in conns:
            writer.close()
    assert time.monotonic() - started < ASYNC_WAIT  # all cut off, none left open
    # each got the 408, or a reset when our trickled bytes were still unread at the close
    assert all(a.startswith(b"HTTP/1.1 408 ") or a == b"" for a in answers), answers
    await still_serves(http, bridge.url)
    text = await (await http.get(f"{bridge.url}/metrics")).text()
    assert 'xwm_connections_closed_total{reason="header_timeout"} 20.0' in text


async def test_a_trickled_body_is_cut_off(
    start_bridge_process: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = limits(request_read_timeout=0.5)
    bridge = await start_bridge_process(config=config, tmp=tmp_path)
    for path in ("/acp/rpc", "/bridge/bootstrap/consume"):
        reader, writer = await open_raw(bridge.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-token-0123456789\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        writer.write(head.encode() + b'{"jsonrpc"')  # 10 of the 1000 bytes, then nothing
        await writer.drain()
        started = time.monotonic()
        async with asyncio.timeout(ASYNC_WAIT):
            status = await reader.readline()
        assert status.startswith(b"HTTP/1.1 400 "), (path, status)
        assert time.monotonic() - started < ASYNC_WAIT
        writer.close()
    await still_serves(http, bridge.url)


async def test_an_idle_keep_alive_connection_is_closed(
    start_bridge_process: StartBridge, tmp_path: Path
) -> None:
    bridge = await start_bridge_process(config=limits(keepalive_timeout=0.5), tmp=tmp_path)
    reader, writer = await open_raw(bridge.port)
    writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive by default
    await writer.drain()
    async with asyncio.timeout(ASYNC_WAIT):
        assert (await reader.readline()).startswith(b"HTTP/1.1 200 ")
    rest = await read_until_closed(reader, ASYNC_WAIT)  # then nothing, and the close
    assert b'{"status":"ok"}' in rest
    writer.close()


async def test_connections_per_address_are_capped(
    start_bridge_process: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bridge = await start_bridge_process(config=limits(max_connections_per_address=5), tmp=tmp_path)
    held = [await open_raw(bridge.port) for _ in range(5)]
    for reader, writer in held:  # each of the five is served
        writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(ASYNC_WAIT):
            assert (await reader.readline()).startswith(b"HTTP/1.1 200 ")
    reader, writer = await open_raw(bridge.port)  # the sixth is refused at once
    refused = await read_until_closed(reader, ASYNC_WAIT)
    assert refused.startswith(b"HTTP/1.1 503 ") and b"too many connections" in refused
    writer.close()
    first_reader, first_writer = held.pop(0)
    first_writer.close()
    await read_until_closed(first_reader, ASYNC_WAIT)

    async def admitted() -> bool:
        r, w = await open_raw(bridge.port)
        w.write(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await w.drain()
        answer = await read_until_closed(r, ASYNC_WAIT)
        w.close()
        return answer.startswith(b"HTTP/1.1 200 ")

    deadline = time.monotonic() + ASYNC_WAIT  # the closed one's slot comes back
    while not await admitted():
        assert time.monotonic() < deadline, "a slot never came back"
        await asyncio.sleep(0.05)
    for _, w in held:
        w.close()
    text = await (await http.get(f"{bridge.url}/metrics")).text()
    line = next(
        x
        for x in text.splitlines()
        if x.startswith('xwm_connections_closed_total{reason="per_address"}')
    )
    assert float(line.split()[-1]) >= 1
