"""The toolbridge stdio loop in-process: the MCP lifecycle (initialize once)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from xwm_bridge import jsonrpc
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge import protocol
from xwm_bridge.toolbridge.server import ToolbridgeServer


def initialize(rid: int, version: str) -> bytes:
    return orjson.dumps(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}},
        }
    )


async def serve(*frames: bytes) -> list[Any]:
    """The replies to ``frames``, sent in one read, then end of input."""
    chunks = [b"".join(frame + b"\n" for frame in frames)]
    out: list[Any] = []

    async def read() -> bytes:
        return chunks.pop(0) if chunks else b""

    async def write(data: bytes) -> None:
        out.append(orjson.loads(data))

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
    return out


async def test_a_second_initialize_is_refused_and_keeps_the_negotiated_version() -> None:
    """MCP: initialize is the first interaction and happens once. A second one is
    ``-32600`` with its id, and the version the first negotiated stays: a batch is
    still judged by it. (It was served: its answer named another version, and from
    then on batches were judged by that one.)"""
    out = await serve(
        initialize(1, "2025-03-26"),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        initialize(2, "2024-11-05"),
        b'[{"jsonrpc":"2.0","id":3,"method":"ping"}]',
    )
    by_id = {reply["id"]: reply for reply in out if isinstance(reply, dict)}
    assert by_id[1]["result"]["protocolVersion"] == "2025-03-26"
    assert by_id[2] == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {
            "code": -32600,
            "message": "invalid request: already initialized (protocol version 2025-03-26)",
        },
    }
    assert [reply for reply in out if isinstance(reply, list)] == [
        [{"jsonrpc": "2.0", "id": 3, "result": {}}]
    ]
    assert len(out) == 3


async def test_the_same_initialize_twice_is_refused_too() -> None:
    """Even asking for the version already negotiated, a repeated initialize is no
    second handshake: it is refused, and the session goes on (a ping after it)."""
    out = await serve(
        initialize(1, "2025-06-18"),
        initialize(2, "2025-06-18"),
        b'{"jsonrpc":"2.0","id":3,"method":"ping"}',
    )
    by_id = {reply["id"]: reply for reply in out}
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18"
    assert by_id[2]["error"] == {
        "code": -32600,
        "message": "invalid request: already initialized (protocol version 2025-06-18)",
    }
    assert by_id[3]["result"] == {}


def test_a_method_name_is_kept_exactly_as_sent() -> None:
    """adapters.md §2.1: the toolbridge matches method names exactly, not trimmed (so
    does MCP): `` ping`` is no ``ping``. A blank method is still ``missing method``."""
    decoded = protocol.decode(b'{"jsonrpc":"2.0","id":1,"method":" ping\\t"}')
    assert isinstance(decoded, jsonrpc.Request)
    assert decoded.method == " ping\t"
    assert protocol.decode(b'{"jsonrpc":"2.0","id":1,"method":"  "}') == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": -32700, "message": "missing method"},
    }


async def test_a_padded_method_is_unknown_and_a_padded_cancel_cancels_nothing() -> None:
    """`` ping`` is answered ``-32601 unknown method``, and ``notifications/cancelled ``
    (a trailing space) is an unknown notification, which cancels nothing. (Both were
    trimmed: the padded ping was served, the padded cancel cancelled.)"""
    out = await serve(
        b'{"jsonrpc":"2.0","id":1,"method":" ping"}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/list"}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled ","params":{"requestId":2}}',
    )
    by_id = {reply["id"]: reply for reply in out}
    assert by_id[1]["error"] == {"code": -32601, "message": "unknown method:  ping"}
    assert [tool["name"] for tool in by_id[2]["result"]["tools"]] == [
        "chat",
        "claude_review",
        "vault_kv",
    ]
    assert len(out) == 2


async def test_a_cancel_naming_the_initialize_request_is_ignored() -> None:
    """MCP: the initialize request MUST NOT be cancelled. A cancel naming it (here
    in the same read, before it started) leaves it to be answered. (It was
    cancelled: never answered, yet the version was recorded, so the client's retry
    was refused as a second initialize.)"""
    out = await serve(
        initialize(1, "2025-06-18"),
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
    )
    assert [reply["id"] for reply in out] == [1]
    assert out[0]["result"]["protocolVersion"] == "2025-06-18"


async def test_a_closed_stdout_ends_the_replies_with_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client died (EPIPE): each reply still due was a "background task failed"
    error line with a traceback; the replies are dropped, said once."""
    frames = [b"".join(orjson.dumps(jsonrpc.request(i, "ping", {})) + b"\n" for i in (1, 2, 3))]
    tried: list[bytes] = []

    async def read() -> bytes:
        return frames.pop(0) if frames else b""

    async def write(data: bytes) -> None:
        tried.append(data)
        raise BrokenPipeError(32, "Broken pipe")

    with caplog.at_level("INFO"):
        async with aiohttp.ClientSession() as http:
            server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
            await asyncio.wait_for(server.serve(), 10)
    assert len(tried) == 1  # nothing more is tried once stdout is gone
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    gone = [
        r for r in caplog.records if r.getMessage() == "client stopped reading; dropping replies"
    ]
    assert len(gone) == 1
