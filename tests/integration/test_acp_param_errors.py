"""Invalid params of ACP requests get ``-32602`` with a message naming what the client
sent (the ACP field, never a bridge-contract one), before any effect. Raw frames over
``/acp/remote``'s WebSocket to the in-process daemon: the SDK's models would refuse to
send most of them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import AUTH, FakeUpstream, StartBridge
from tests.integration.test_acp_remote import config

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


async def ask(ws: aiohttp.ClientWebSocketResponse, rid: int, method: str, params: Any) -> Any:
    await ws.send_str(
        orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).decode()
    )
    while True:
        msg = await asyncio.wait_for(ws.receive(), 20)
        assert msg.type is aiohttp.WSMsgType.TEXT, msg
        frame = orjson.loads(msg.data)
        if frame.get("id") == rid and "method" not in frame:
            return frame


async def test_invalid_params_name_the_acp_field(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    url = f"{bp.url}/acp/remote".replace("http", "ws")
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=AUTH) as ws:
        await ask(ws, 1, "initialize", {"protocolVersion": 1})
        new = await ask(ws, 2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
        sid = new["result"]["sessionId"]
        for rid, method, params, says in (
            (3, "session/set_mode", {"sessionId": sid, "modeId": 5}, "modeId"),
            (4, "session/set_mode", {"sessionId": sid}, "modeId"),
            (5, "session/set_config_option", {"sessionId": sid, "configId": "route"}, "value"),
            # a prompt whose text blocks are all empty: not "taskPrompt is required"
            (
                6,
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": "text", "text": " "}]},
                "prompt",
            ),
            # a block whose type is an array: not a TypeError answered -32603
            (
                8,
                "session/prompt",
                {"sessionId": sid, "prompt": [{"type": ["text"], "text": "hi"}]},
                "prompt[0]",
            ),
        ):
            error = (await ask(ws, rid, method, params))["error"]
            assert error["code"] == -32602, (method, error)
            assert says in error["message"] and "taskPrompt" not in error["message"], error
        # nothing happened: no turn ran, the session kept its route and has no title
        assert not fake_upstream.state.requests
        listed = await ask(ws, 7, "session/list", {})
        (info,) = listed["result"]["sessions"]
        assert "title" not in info and info["_meta"]["xwm-bridge/route"] == "single-agent:codex"
