from __future__ import annotations

import aiohttp

from tests.conftest import FakeUpstream, StartBridge, provider_env, rpc, session_params, sse


async def test_capabilities_and_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    caps = await rpc(http, bridge.rpc_url, "acp.capabilities")
    assert caps["result"]["singleAgent"] is True
    reply = await rpc(http, bridge.rpc_url, "session.start", session_params("s1", "ping"))
    assert reply["result"]["success"] is True, reply
    assert reply["result"]["output"] == "echo: ping"
    events = await sse(http, bridge.rpc_url, "session.message", session_params("s1", "pong"))
    print(events)
    assert events[-1]["result"]["output"] == "echo: pong"
