"""Keep-alives on long, silent turns (issue 15 item 6): SSE comment lines every
``limits.sse_keepalive`` on every SSE stream, WebSocket pings on client sockets."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import aiohttp
import orjson

from tests.conftest import (
    AUTH,
    FakeUpstream,
    StartBridge,
    providers_config,
    session_params,
    sse,
    wait_until,
)

KEEPALIVE = b": keep-alive\n\n"


def config(upstream: FakeUpstream, **limits: float) -> dict[str, object]:
    return providers_config({"id": "codex", "endpoint": upstream.url}, limits=limits)


async def test_a_silent_sse_turn_sends_comment_lines(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bp = await start_bridge(config=config(fake_upstream, sse_keepalive=0.2), tmp=tmp_path)
    body = {"jsonrpc": "2.0", "id": 1, "method": "session.start"}
    body["params"] = session_params("ka", "slow:1200 quiet")
    headers = {**AUTH, "Accept": "text/event-stream"}
    chunks: list[tuple[float, bytes]] = []
    async with http.post(bp.rpc_url, data=orjson.dumps(body), headers=headers) as resp:
        async for chunk in resp.content.iter_any():
            chunks.append((time.monotonic(), chunk))
    raw = b"".join(c for _, c in chunks)
    blocks = [b for b in raw.split(b"\n\n") if b]
    comments = [b for b in blocks if b.startswith(b":")]
    assert len(comments) >= 3, raw  # 1.2 s of silence at 0.2 s
    assert all(b == KEEPALIVE.rstrip(b"\n") for b in comments)
    data = [orjson.loads(b[6:]) for b in blocks if b.startswith(b"data: ")]
    assert data[0]["params"]["event"] == "started"
    assert data[-1]["result"]["output"] == "echo: quiet"
    # each comment only after silence: never two within less than the interval
    stamps = [t for t, c in chunks if c.startswith(b":")]
    assert all(b - a >= 0.15 for a, b in itertools.pairwise(stamps)), stamps


async def test_keepalive_off_and_fast_turns_send_none(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bp = await start_bridge(config=config(fake_upstream, sse_keepalive=0), tmp=tmp_path)
    events = await sse(http, bp.rpc_url, "session.start", session_params("k0", "slow:600 x"))
    assert events[-1]["result"]["success"] is True  # sse() refuses any non-data block


async def test_the_catchup_stream_uses_the_configured_keepalive(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bp = await start_bridge(config=config(fake_upstream, sse_keepalive=0.2), tmp=tmp_path)
    await sse(http, bp.rpc_url, "session.start", session_params("kc", "hi"))
    url = f"{bp.url}/acp/sessions/kc/events?follow=1&afterEventId=999"
    got = b""
    async with http.get(url, headers=AUTH) as resp:
        while got.count(KEEPALIVE) < 2:
            got += await asyncio.wait_for(resp.content.readany(), 5)
    assert got == KEEPALIVE * got.count(KEEPALIVE)


async def test_client_websockets_are_pinged(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bp = await start_bridge(config=config(fake_upstream, ws_heartbeat=0.3), tmp=tmp_path)
    pings = 0
    async with http.ws_connect(bp.ws_url, headers=AUTH, autoping=False) as ws:
        started = time.monotonic()
        while pings < 2:
            msg = await ws.receive(timeout=5)
            if msg.type == aiohttp.WSMsgType.PING:
                pings += 1
                await ws.pong(msg.data)
        assert time.monotonic() - started < 3
    await wait_until(lambda: True)
