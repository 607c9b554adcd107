"""DNS rebinding against a bridge that requires no token (transport/security.py
``ServedHosts``): a page on ``evil.example`` whose name is rebound to 127.0.0.1 is
same-origin for the browser, so its requests reach the loopback bridge with
``Host: evil.example:PORT`` (GETs without ``Origin``). Such a bridge answers 421 on
every route, through aiohttp and through the ``/acp/rpc`` front; a bridge with a
token answers any ``Host`` (a proxy forwards its public name)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import (
    AUTH,
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    log_entries,
    read_metric,
    rpc,
    session_params,
)
from tests.integration.test_front import Client, kept, post
from tests.integration.test_security import WS_UPGRADE

EVIL = "evil.example"
ANY_BEARER = {"Authorization": "Bearer anything"}
REFUSED = "421 misdirected request: this bridge does not answer that Host name (allowed_hosts)\n"


def rejected(reason: str, transport: str = "http") -> str:
    return f'xwm_rejected_requests_total{{reason="{reason}",transport="{transport}"}}'


async def tokenless(start_bridge: StartBridge, upstream: FakeUpstream, **env: str) -> Any:
    return await start_bridge(env=base_env(XWM_PROVIDER_CODEX_URL=upstream.url, **env))


async def status_of(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, str, str]:
    async with http.get(url, headers=headers) as resp:  # the head is enough
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_a_tokenless_bridge_refuses_a_foreign_host_on_every_route(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bridge = await tokenless(start_bridge, fake_upstream)
    started = await rpc(
        http,
        bridge.rpc_url,
        "session.start",
        session_params("s1", "secret plan"),
        headers=ANY_BEARER,
    )
    assert started["result"]["success"] is True, started
    evil = f"{EVIL}:{bridge.port}"
    # GETs of a rebinding page carry no Origin: the SSE catch-up (the session's
    # whole ledger), /metrics, the other read-only routes
    for path in ("/acp/sessions/s1/events", "/metrics", "/readyz", "/api/ping", "/console"):
        status, ctype, body = await status_of(
            http, f"{bridge.url}{path}", {"Host": evil, **ANY_BEARER}
        )
        assert (status, body) == (421, REFUSED), path
        assert ctype.startswith("text/plain")
    # a WebSocket upgrade carries the page's own origin: refused before the origin check
    origin = {"Host": evil, "Origin": f"http://{evil}", **WS_UPGRADE}
    for path in ("/acp", "/console/ws", "/acp/remote"):
        status, _, body = await status_of(http, f"{bridge.url}{path}", origin)
        assert (status, body) == (421, REFUSED), path
    # POST /acp/rpc answered by the front (a fresh connection whose first request it is)
    client = await Client.open(bridge.port)
    await client.send(post(auth=True).replace(b"Host: x", f"Host: {evil}".encode()))
    answer = await client.answer()
    assert (answer.status, answer.body.decode()) == (421, REFUSED)
    assert await kept(bridge) == 1  # the front answered it, and keeps the connection
    await client.send(
        post(auth=True).replace(b"Host: x", f"Host: 127.0.0.1:{bridge.port}".encode())
    )
    assert (await client.answer()).status == 200  # the next request names the bridge
    client.close()
    # counted and logged with the reason (and the Host, never the bearer)
    assert await read_metric(http, bridge.url, rejected("host_not_allowed")) == 6
    assert await read_metric(http, bridge.url, rejected("host_not_allowed", "ws")) == 3
    lines = [e for e in log_entries(bridge.logs) if e.get("reason") == "host_not_allowed"]
    assert len(lines) == 9 and all(e["host"] == evil and e["status"] == 421 for e in lines)
    assert not any("anything" in line for line in bridge.logs)


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "app.localhost:{port}", "[::1]:{port}",
     "10.1.2.3:{port}", "bridge.lan:{port}", "other.lan"],
)  # fmt: skip
async def test_a_tokenless_bridge_answers_its_own_names(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    fake_upstream: FakeUpstream,
    host: str,
) -> None:
    bridge = await tokenless(start_bridge, fake_upstream, XWM_ALLOWED_HOSTS="bridge.lan, other.lan")
    name = host.format(port=bridge.port)
    status, _, _ = await status_of(http, f"{bridge.url}/metrics", {"Host": name})
    assert status == 200
    client = await Client.open(bridge.port)
    await client.send(post().replace(b"Host: x", f"Host: {name}".encode()))
    assert (await client.answer()).status == 200
    client.close()


async def test_a_tokenless_bridge_answers_a_request_without_host_and_its_console(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bridge = await tokenless(start_bridge, fake_upstream)
    client = await Client.open(bridge.port)  # HTTP/1.0 without Host: not a browser
    await client.send(b"GET /livez HTTP/1.0\r\n\r\n")
    assert (await client.answer()).status == 200
    client.close()
    own = f"http://localhost:{bridge.port}"
    async with http.ws_connect(
        f"ws://localhost:{bridge.port}/console/ws", headers={"Origin": own}
    ) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "console.auth", "params": {}})
        assert (await ws.receive_json(timeout=5))["result"]["authenticated"] is True


async def test_a_bridge_with_a_token_answers_any_host(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN=TOKEN))
    headers = {"Host": "bridge.example.com", **AUTH}
    status, _, _ = await status_of(http, f"{bridge.url}/metrics", headers)
    assert status == 200
    client = await Client.open(bridge.port)
    await client.send(post().replace(b"Host: x", b"Host: bridge.example.com"))
    assert (await client.answer()).status == 200
    client.close()
    async with http.ws_connect(bridge.ws_url, headers=headers) as ws:
        await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
        assert "result" in await ws.receive_json(timeout=5)
