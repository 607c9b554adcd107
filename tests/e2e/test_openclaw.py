"""The bridge against a real OpenClaw gateway (protocol 4), its default agent on the fake LLM.

``.ci/run`` installs Node 24 and ``openclaw@2026.9.6`` into ``.peers/openclaw``.
Locally these tests skip with a reason when it is missing; in CI (``CI=true``) they fail.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from internal.peers import openclaw
from tests.conftest import (
    ROOT,
    TOKEN,
    BridgeProcess,
    StartBridge,
    base_env,
    eventually,
    log_entries,
    rpc,
    sse,
    wait_until,
)
from tests.integration.test_gateway import WsClient, open_ws, prove_no_redial

GATEWAY_TOKEN = "e2e-openclaw-token-0123"
ROUTING = {
    "routingMode": "explicit",
    "explicitExecutionTarget": "gateway",
    "preferredGatewayProviderId": "openclaw",
}
CONNECT = {"runtimeId": "oc-1", "gatewayProviderId": "openclaw", "clientId": "gateway-client"}

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def fake_llm_url() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "internal.peers.fake_llm", "--port", "0"],
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().strip()  # "listening 127.0.0.1:<port>"
        assert line.startswith("listening "), line
        yield f"http://{line.split(' ', 1)[1]}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def gateway(fake_llm_url: str) -> Iterator[openclaw.OpenClawGateway]:
    if not openclaw.installed():
        reason = f"OpenClaw gateway not installed in {openclaw.PEER_DIR} (run .ci/run)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    tmp = Path(tempfile.mkdtemp(prefix="xwm-openclaw-"))
    gw = openclaw.OpenClawGateway(tmp, openclaw.free_port(), GATEWAY_TOKEN, fake_llm_url)
    try:
        gw.start()
        yield gw
    finally:
        gw.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        openclaw.cleanup_system_tmp()


async def bridge_for(
    start_bridge: StartBridge, gw: openclaw.OpenClawGateway, tmp: Path, token: str = GATEWAY_TOKEN
) -> BridgeProcess:
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_OPENCLAW_URL=gw.url, XWM_OPENCLAW_TOKEN=token)
    config = {"gateway": {"backoff_initial": 0.5, "backoff_max": 2.0, "turn_timeout": 90}}
    return await start_bridge(env=env, config=config, tmp=tmp)


async def call(http: aiohttp.ClientSession, url: str, method: str, params: Any) -> dict[str, Any]:
    reply = await rpc(http, url, method, params)
    assert "result" in reply, reply
    out: dict[str, Any] = reply["result"]
    return out


async def test_connect_protocol_4_and_requests(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: openclaw.OpenClawGateway,
    tmp_path: Path,
) -> None:
    bp = await bridge_for(start_bridge, gateway, tmp_path)
    res = await call(http, bp.rpc_url, "xworkmate.gateway.connect", CONNECT)
    assert res["ok"] is True, res
    snap = res["snapshot"]
    assert snap["status"] == "connected" and snap["protocol"] == 4
    assert snap["mainSessionKey"] == "agent:main:main"
    assert snap["connectAuthSources"] == ["bridge"] and snap["hasSharedAuth"] is True
    for method in ("health", "status", "sessions.list"):
        out = await call(
            http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "oc-1", "method": method}
        )
        assert out["ok"] is True, (method, out)
        assert isinstance(out["payload"], dict)
    assert not any(GATEWAY_TOKEN in line for line in bp.logs)


async def test_gateway_turn_streams_the_fake_llm_reply(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: openclaw.OpenClawGateway,
    tmp_path: Path,
) -> None:
    bp = await bridge_for(start_bridge, gateway, tmp_path)
    assert (await call(http, bp.rpc_url, "xworkmate.gateway.connect", CONNECT))["ok"] is True
    params = {"sessionId": "e2e-turn", "taskPrompt": "hello from e2e", "routing": ROUTING}
    events = await sse(http, bp.rpc_url, "session.message", params)
    final = events[-1]["result"]
    assert final["success"] is True, final
    assert final["output"] == "FAKE-LLM says: hello from e2e"
    assert final["mode"] == "gateway-chat" and final["stopReason"] == "stop"
    updates = [e["params"] for e in events if e.get("method") == "session.update"]
    deltas = "".join(u["delta"] for u in updates if u.get("type") == "delta")
    assert deltas == "FAKE-LLM says: hello from e2e"


async def test_cancel_mid_run_aborts_the_run(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: openclaw.OpenClawGateway,
    fake_llm_url: str,
    tmp_path: Path,
) -> None:
    bp = await bridge_for(start_bridge, gateway, tmp_path)
    ws = await open_ws(http, bp.ws_url)
    try:
        assert (await ws.call("xworkmate.gateway.connect", CONNECT))["ok"] is True
        params = {"sessionId": "e2e-cancel", "taskPrompt": "slow:30000 take your time"}
        rid = await ws.send("session.message", {**params, "routing": ROUTING})

        # the fake LLM got the prompt: the model call is in flight (30 s)
        async def llm_called() -> bool:
            async with http.get(f"{fake_llm_url}/_requests") as resp:
                return "take your time" in await resp.text()

        await eventually(llm_called, within=60)
        cancel = await ws.call("session.cancel", {"sessionId": "e2e-cancel"})
        assert cancel["cancelled"] is True
        reply = (await ws.reply(rid, 20))["result"]
        assert reply["success"] is False and reply["cancelled"] is True
        assert reply["aborted"] is True

        def run_aborted() -> bool:
            return any(e["payload"].get("state") == "aborted" for e in ws.pushes("chat"))

        await wait_until(run_aborted, 20)
    finally:
        await ws.close()


async def test_wrong_token_is_a_clean_fatal_error(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: openclaw.OpenClawGateway,
    tmp_path: Path,
) -> None:
    bp = await bridge_for(start_bridge, gateway, tmp_path, token="not-the-token")
    res = await call(http, bp.rpc_url, "xworkmate.gateway.connect", CONNECT)
    assert res["ok"] is False
    assert res["error"]["details"]["code"] == "AUTH_TOKEN_MISMATCH"
    assert res["snapshot"]["status"] == "error"
    await prove_no_redial(http, bp.rpc_url)  # a retry would have shown in the log by then
    mine = [e["msg"] for e in log_entries(bp.logs) if e.get("runtime_id") == "oc-1"]
    assert not any("reconnect firing" in m for m in mine)
    assert sum(m.startswith("attempt ") for m in mine) == 1


async def test_runtime_survives_a_gateway_restart(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: openclaw.OpenClawGateway,
    tmp_path: Path,
) -> None:
    bp = await bridge_for(start_bridge, gateway, tmp_path)
    ws: WsClient = await open_ws(http, bp.ws_url)
    try:
        assert (await ws.call("xworkmate.gateway.connect", CONNECT))["ok"] is True
        await asyncio.to_thread(gateway.restart)
        await wait_until(
            lambda: (
                bool(ws.snapshots())
                and ws.snapshots()[-1]["status"] == "connected"
                and any(s["statusText"] == "Disconnected" for s in ws.snapshots())
            ),
            60,
        )
        params = {"sessionId": "e2e-restart", "taskPrompt": "back again", "routing": ROUTING}
        turn = await ws.call("session.message", params, within=90)
        assert turn["success"] is True, turn
        assert turn["output"] == "FAKE-LLM says: back again"
    finally:
        await ws.close()
