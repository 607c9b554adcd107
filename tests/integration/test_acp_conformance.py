"""The ACP front door against the protocol's rules (agentclientprotocol.com, schema v1):
version negotiation, the methods of the schema the bridge does not serve, stop reasons,
the advertised prompt capabilities. The in-process daemon's ``/acp/remote``: raw frames
where the SDK's models would not send them, else the official SDK's WebSocket client;
every frame of the SDK's connections is schema-checked (``FrameChecker``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from acp import schema

from tests.acp_schema import check_error, strict
from tests.conftest import AUTH, FakeUpstream, StartBridge
from tests.integration.test_acp_remote import config

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


async def send(ws: aiohttp.ClientWebSocketResponse, frame: dict[str, Any]) -> None:
    await ws.send_str(orjson.dumps({"jsonrpc": "2.0", **frame}).decode())


async def ask(ws: aiohttp.ClientWebSocketResponse, rid: Any, method: str, params: Any) -> Any:
    """Send one request; the next frame must be its answer (nothing else comes first)."""
    await send(ws, {"id": rid, "method": method, "params": params})
    msg = await asyncio.wait_for(ws.receive(), 20)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    frame = orjson.loads(msg.data)
    assert frame.get("id") == rid and "method" not in frame, frame
    return frame


def ws_url(bp: Any) -> str:
    return f"{bp.url}/acp/remote".replace("http", "ws")


async def test_protocol_version_negotiation(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # ACP: the agent answers the requested version when it supports it, else the latest
    # it supports (the client then disconnects if it cannot speak that one). A legacy
    # string version (clients of the MCP-style date era, e.g. older Zed builds) is
    # version 0 to the Rust SDK and parsed or taken as 1 by the Python SDK: never refused.
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        for rid, version in enumerate((1, 0, 2, 65535, "2024-11-05", "1"), 1):
            answer = await ask(ws, rid, "initialize", {"protocolVersion": version})
            assert "error" not in answer, (version, answer)
            strict(schema.InitializeResponse, answer["result"])
            assert answer["result"]["protocolVersion"] == 1, version
        # protocolVersion is required (a uint16, or a legacy string): anything else is
        # invalid params
        for rid, params in enumerate(
            ({}, {"protocolVersion": None}, {"protocolVersion": -1}, {"protocolVersion": [1]}),
            10,
        ):
            answer = await ask(ws, rid, "initialize", params)
            check_error(answer["error"])
            assert answer["error"]["code"] == -32602 and "protocolVersion" in str(answer), params
