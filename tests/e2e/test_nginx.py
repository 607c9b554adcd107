"""The shipped nginx locations in front of the real daemon: SSE streams unbuffered,
WebSocket upgrades, and a cancel reaches a running turn through the proxy."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    ROOT,
    FakeUpstream,
    StartBridge,
    closed_port,
    provider_env,
    rpc,
    session_params,
    wait_until,
)

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
LOCATIONS = ROOT / "deploy" / "nginx" / "locations.conf"

if NGINX is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("nginx is required in CI (.ci/run installs it)")
    pytest.skip("nginx is not installed (apt-get install nginx-light)", allow_module_level=True)


async def _start_nginx(tmp: Path, bridge_port: int) -> tuple[asyncio.subprocess.Process, int]:
    port = closed_port()
    conf = tmp / "nginx.conf"
    conf.write_text(
        f"""
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    limit_req_zone $binary_remote_addr zone=xwm_bootstrap:1m rate=10r/m;
    upstream xwm_bridge {{ server 127.0.0.1:{bridge_port}; keepalive 8; }}
    server {{
        listen 127.0.0.1:{port};
        include {LOCATIONS};
    }}
}}
"""
    )
    assert NGINX is not None
    proc = await asyncio.create_subprocess_exec(
        NGINX,
        "-p",
        str(tmp),
        "-c",
        str(conf),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return proc, port
        except OSError:
            if proc.returncode is not None:
                err = await proc.stderr.read() if proc.stderr else b""
                raise RuntimeError(f"nginx exited: {err.decode()}") from None
            await asyncio.sleep(0.05)
    raise RuntimeError("nginx did not start listening")


@pytest.fixture
async def proxied(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[str]:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    proc, port = await _start_nginx(tmp_path, bridge.port)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def test_sse_streams_through_nginx_unbuffered(
    proxied: str, http: aiohttp.ClientSession
) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": "p1",
        "method": "session.start",
        "params": session_params("ngx-sse", "slow:1500 through the proxy"),
    }
    headers = {**AUTH, "Accept": "text/event-stream"}
    started = time.monotonic()
    arrivals: list[tuple[float, bytes]] = []
    async with http.post(
        f"http://{proxied}/acp/rpc", data=orjson.dumps(body), headers=headers
    ) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                arrivals.append((time.monotonic() - started, event))
    events = [orjson.loads(e[len(b"data: ") :]) for _, e in arrivals]
    assert events[0]["params"]["event"] == "started"
    assert events[-1]["result"]["output"] == "echo: through the proxy"
    # the started update arrived long before the 1.5 s turn ended: nothing buffered it
    assert arrivals[0][0] < 1.0 <= arrivals[-1][0]


async def test_websocket_and_cancel_through_nginx(
    proxied: str, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    async with http.ws_connect(f"ws://{proxied}/acp", headers=AUTH) as ws:
        await ws.send_str('{"jsonrpc":"2.0","id":"c","method":"acp.capabilities"}')
        caps = orjson.loads((await ws.receive(timeout=5)).data)
        assert caps["result"]["singleAgent"] is True
        turn = {
            "jsonrpc": "2.0",
            "id": "t",
            "method": "session.start",
            "params": session_params("ngx-ws", "slow:20000 cancel me"),
        }
        await ws.send_bytes(orjson.dumps(turn))
        await wait_until(lambda: "ngx-ws" in fake_upstream.state.active)
        # the cancel goes over plain HTTP through the proxy while the turn streams on the WS
        reply = await rpc(
            http, f"http://{proxied}/acp/rpc", "session.cancel", {"sessionId": "ngx-ws"}
        )
        assert reply["result"] == {"accepted": True, "cancelled": True}
        result = None
        while result is None:
            frame = orjson.loads((await ws.receive(timeout=10)).data)
            if frame.get("id") == "t":
                result = frame["result"]
    assert result["success"] is False and result["cancelled"] is True
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["ngx-ws"]


async def test_metrics_restricted_and_probes_open(
    proxied: str, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"http://{proxied}/livez") as resp:
        assert resp.status == 200
    async with http.get(f"http://{proxied}/metrics") as resp:
        assert resp.status == 200  # allowed from 127.0.0.1 only
        assert "# HELP xwm_requests_total" in await resp.text()


@pytest.mark.parametrize("kind", ["ws", "http"])
async def test_acp_remote_through_nginx(
    kind: str, proxied: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    from acp import connect_to_agent, text_block
    from acp.http import create_http_stream
    from acp.ws import create_websocket_stream

    from tests.acp_schema import FrameChecker
    from tests.integration.acp_helpers import RecordingClient

    url = f"http://{proxied}/acp/remote"
    if kind == "ws":
        transport = await create_websocket_stream(url.replace("http", "ws"), headers=AUTH)
    else:
        transport = create_http_stream(url, headers=AUTH)
    checker = FrameChecker()
    conn = connect_to_agent(RecordingClient(), transport, observers=[checker])
    try:
        await asyncio.wait_for(conn.initialize(protocol_version=1), 10)
        meta = {"xwm-bridge/route": "single-agent:codex"}
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[], **meta)
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("via nginx")]), 20
        )
        assert answer.stop_reason == "end_turn"
        assert checker.text() == "echo: via nginx"
    finally:
        await conn.close()
    checker.assert_clean()
