"""The toolbridge stdio loop in-process: call slots and the in-flight table."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge.server import ToolbridgeServer


async def test_cancel_before_the_call_starts_frees_its_slot() -> None:
    """A request and its ``notifications/cancelled`` in one read: the call is cancelled
    before its first step, and its slot and in-flight entry are still released (they
    leaked, and with every slot gone the server stopped reading stdin for good)."""
    chunks = [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}\n',
        b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n',
    ]
    replied = asyncio.Event()
    out: list[bytes] = []

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        await replied.wait()
        return b""

    async def write(data: bytes) -> None:
        out.append(data)
        replied.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(
            ToolbridgeConfig(max_concurrent_calls=1), http, read, write, max_message=1 << 20
        )
        await asyncio.wait_for(server.serve(), 10)
    assert [orjson.loads(line) for line in out] == [{"jsonrpc": "2.0", "id": 2, "result": {}}]
    assert server._inflight == {}
