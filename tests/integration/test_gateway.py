"""Gateway runtimes and gateway-mode turns: the real daemon against the in-repo fake gateway.

Covers gateway.md §2/§9/§10 and the fixes of ARCHITECTURE.md §2: per-principal
ownership, out-of-request events only to the owner's live WebSockets, backoff
reconnect that stops on fatal errors, tick liveness, fail-fast pending
requests, idle reaping, ``chat.abort`` on cancel and on the turn deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from internal.peers.fake_gateway import TOKEN as GW_TOKEN
from internal.peers.fake_gateway import FakeGateway, FakeGatewayState
from tests.conftest import (
    AUTH,
    TOKEN,
    StartBridge,
    base_env,
    eventually,
    log_entries,
    rpc,
    sse,
    wait_until,
)
from xwm_bridge.config import BridgeConfig, GatewayConfig
from xwm_bridge.core import handles
from xwm_bridge.gateway import signing
from xwm_bridge.gateway.connect_params import ConnectParams, build_connect_config
from xwm_bridge.gateway.runtime import GatewayRuntime

GATEWAY_ROUTING = {
    "routingMode": "explicit",
    "explicitExecutionTarget": "gateway",
    "preferredGatewayProviderId": "local",
}


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    gw = FakeGateway(FakeGatewayState())
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


def connect_params(
    gw: FakeGateway, runtime_id: str = "rt-1", token: str = GW_TOKEN
) -> dict[str, Any]:
    return {
        "runtimeId": runtime_id,
        "gatewayProviderId": "local",
        "endpoint": {"host": "127.0.0.1", "port": gw.port, "tls": False},
        "auth": {"token": token},
        "packageInfo": {"appName": "XWorkmate", "version": "1.0"},
        "deviceInfo": {"platform": "linux"},
    }


def turn_params(session_id: str, prompt: str) -> dict[str, Any]:
    return {"sessionId": session_id, "taskPrompt": prompt, "routing": GATEWAY_ROUTING}


def gw_config(tmp: Path, **gateway: Any) -> dict[str, Any]:
    return {"gateway": {"backoff_initial": 0.1, "backoff_max": 0.5, **gateway}}


async def result_of(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: Any,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    reply = await rpc(http, url, method, params, headers=headers)
    assert "result" in reply, reply
    out: dict[str, Any] = reply["result"]
    return out


class WsClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.notes: list[dict[str, Any]] = []
        self.replies: dict[Any, dict[str, Any]] = {}
        self._n = 0
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = orjson.loads(msg.data)
            if "method" in data:
                self.notes.append(data)
            else:
                self.replies[data.get("id")] = data

    async def send(self, method: str, params: dict[str, Any]) -> int:
        self._n += 1
        body = {"jsonrpc": "2.0", "id": self._n, "method": method, "params": params}
        await self.ws.send_str(orjson.dumps(body).decode())
        return self._n

    async def reply(self, rid: int, within: float = 15) -> dict[str, Any]:
        await wait_until(lambda: rid in self.replies, within)
        return self.replies[rid]

    async def call(self, method: str, params: dict[str, Any], within: float = 15) -> dict[str, Any]:
        reply = await self.reply(await self.send(method, params), within)
        assert "result" in reply, reply
        out: dict[str, Any] = reply["result"]
        return out

    def pushes(self, event: str) -> list[dict[str, Any]]:
        return [
            n["params"]["event"]
            for n in self.notes
            if n["method"] == "xworkmate.gateway.push" and n["params"]["event"]["event"] == event
        ]

    def snapshots(self) -> list[dict[str, Any]]:
        return [
            n["params"]["snapshot"]
            for n in self.notes
            if n["method"] == "xworkmate.gateway.snapshot"
        ]

    def logs(self) -> list[str]:
        return [
            n["params"]["log"]["message"]
            for n in self.notes
            if n["method"] == "xworkmate.gateway.log"
        ]

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


async def open_ws(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] = AUTH
) -> WsClient:
    ws = await http.ws_connect(url, headers=headers)
    return WsClient(ws)


async def prove_no_redial(http: aiohttp.ClientSession, rpc_url: str, redials: int = 5) -> None:
    """Return once a retry loop would have dialed again (the positive proof that a fatal
    connect did not): a sibling runtime on the same daemon, with the same backoff, whose
    gateway drops it right after each hello-ok, has redialed ``redials`` times. Each of its
    waits is at least ``backoff_initial / 2`` (the jitter floor of the first, smallest
    ceiling), and the first retry of the fatal runtime would have come after at most
    ``backoff_initial``."""
    flaky = FakeGateway(FakeGatewayState(drop_after_connect=1_000_000))
    await flaky.start()
    try:
        res = await result_of(
            http, rpc_url, "xworkmate.gateway.connect", connect_params(flaky, "rt-sibling")
        )
        assert res["ok"] is True
        await wait_until(lambda: flaky.state.connects > redials, 10)
        # let it stay connected, then disconnect it: a disconnect that lands just as the
        # gateway drops the socket can hang (the runtime's read loses the cancellation when
        # recv fails at the same moment, Python 3.11's asyncio.wait_for)
        flaky.state.drop_after_connect = 0

        async def settled() -> bool:  # a request answered over a socket that stays
            out = await result_of(
                http,
                rpc_url,
                "xworkmate.gateway.request",
                {"runtimeId": "rt-sibling", "method": "health"},
            )
            return out["ok"] is True

        await eventually(settled)
        await result_of(http, rpc_url, "xworkmate.gateway.disconnect", {"runtimeId": "rt-sibling"})
    finally:
        await flaky.stop()


# --- xworkmate.gateway.connect / request / disconnect --------------------------------------


async def test_connect_request_disconnect(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True and res["error"] is None
    snap = res["snapshot"]
    assert snap["status"] == "connected" and snap["statusText"] == "Connected"
    assert snap["protocol"] == 4 and snap["mainSessionKey"] == "agent:main:main"
    assert snap["serverName"] == "fake-gateway"
    async with http.get(f"{bp.url}/metrics") as resp:
        assert 'xwm_gateway_runtimes{state="connected"} 1.0' in await resp.text()

    for method in ("health", "status", "sessions.list"):
        out = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": method}
        )
        assert out["ok"] is True and isinstance(out["payload"], dict), out

    unknown = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "nope", "method": "health"}
    )
    assert unknown == {
        "ok": False,
        "payload": None,
        "error": {"message": "gateway not connected", "code": "OFFLINE"},
    }

    gateway.state.fail_next["status"] = {
        "code": "UNAVAILABLE",
        "message": "busy",
        "details": {"code": "X"},
    }
    failed = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "status"}
    )
    assert failed == {
        "ok": False,
        "payload": None,
        "error": {"message": "busy", "code": "UNAVAILABLE", "details": {"code": "X"}},
    }

    assert await result_of(
        http, bp.rpc_url, "xworkmate.gateway.disconnect", {"runtimeId": "rt-1"}
    ) == {"accepted": True}
    after = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
    )
    assert after["error"]["code"] == "OFFLINE"
    await wait_until(lambda: not gateway.state.connections, 5)


async def test_connect_param_errors(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway
) -> None:
    bp = await start_bridge()
    blank = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", {"runtimeId": "  "})
    assert blank == {
        "ok": False,
        "snapshot": None,
        "auth": None,
        "returnedDeviceToken": "",
        "error": {"message": "runtimeId is required", "code": "INVALID_RUNTIME_ID"},
    }
    bad = await rpc(
        http, bp.rpc_url, "xworkmate.gateway.connect", {"runtimeId": "r", "endpoint": "x"}
    )
    assert bad["error"]["code"] == -32602 and "endpoint" in bad["error"]["message"]


async def test_wrong_token_is_fatal_without_reconnect_storm(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    res = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway, token="wrong")
    )
    assert res["ok"] is False
    assert res["error"]["code"] == "INVALID_REQUEST"
    assert res["error"]["details"] == {"code": "AUTH_TOKEN_MISMATCH"}
    assert (
        res["snapshot"]["status"] == "error"
        and res["snapshot"]["lastErrorDetailCode"] == "AUTH_TOKEN_MISMATCH"
    )
    await prove_no_redial(http, bp.rpc_url)
    assert gateway.state.connects == 1


async def test_protocol_negotiation(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    old = FakeGateway(FakeGatewayState(protocol=3))
    future = FakeGateway(FakeGatewayState(protocol=5))
    await old.start()
    await future.start()
    try:
        res = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(old, "old")
        )
        assert res["ok"] is True and res["snapshot"]["protocol"] == 3
        res = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(future, "new")
        )
        assert res["ok"] is False and res["error"]["code"] == "PROTOCOL_MISMATCH"
        await prove_no_redial(http, bp.rpc_url)
        assert future.state.connects == 1  # fatal: no retry
    finally:
        await old.stop()
        await future.stop()


async def test_retryable_failure_reconnects_with_backoff(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gw = FakeGateway(FakeGatewayState(no_challenge=True))
    await gw.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path, challenge_timeout=0.3), tmp=tmp_path)
        ws = await open_ws(http, bp.ws_url)
        res = await ws.call("xworkmate.gateway.connect", connect_params(gw))
        assert res["ok"] is False and res["error"]["code"] == "CONNECT_CHALLENGE_TIMEOUT"
        gw.state.no_challenge = False  # the gateway heals: the runtime gets there on its own
        await wait_until(lambda: gw.state.handshakes_ok >= 1, 10)
        await wait_until(lambda: any(s["status"] == "connected" for s in ws.snapshots()), 5)
        assert any("scheduling reconnect" in m for m in ws.logs())
        await ws.close()
    finally:
        await gw.stop()


async def test_gateway_closing_right_after_the_challenge_is_a_retryable_failure(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # the challenge and the close arrive together: the bridge reads the challenge, then
    # its ``connect`` meets a closed socket, on the first attempt and on a reconnect
    gw = FakeGateway(FakeGatewayState(close_after_challenge=2))
    await gw.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
        ws = await open_ws(http, bp.ws_url)
        res = await ws.call("xworkmate.gateway.connect", connect_params(gw))
        assert res["ok"] is False, res
        assert res["error"] == {"message": "service restart", "code": "SOCKET_CLOSED"}
        assert res["snapshot"]["status"] == "error"
        await wait_until(lambda: gw.state.handshakes_ok >= 1, 10)  # the second close too
        assert gw.state.connects == 3
        await wait_until(lambda: any(s["status"] == "connected" for s in ws.snapshots()), 5)
        out = await ws.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"})
        assert out["ok"] is True, out
        await ws.close()
    finally:
        await gw.stop()


async def test_a_connect_is_not_held_by_a_client_slow_to_take_its_announcement(
    gateway: FakeGateway,
) -> None:
    # a client that stops reading while ``connected`` is delivered: the connect used to
    # wait on that delivery (and a cancel of its caller landed there); now it only queues
    settings = GatewayConfig(backoff_initial=0.1, backoff_max=0.5, notify_timeout=30)
    rt = GatewayRuntime("rt-c", "alice", settings)
    announced, never = asyncio.Event(), asyncio.Event()

    async def slow_client(message: dict[str, Any]) -> None:
        params = message["params"]
        if params.get("snapshot", {}).get("status") == "connected":
            announced.set()
            await never.wait()  # far past the guard below (notify_timeout 30 s)

    rt.attach(slow_client, None)
    cfg = build_connect_config(
        ConnectParams.parse(connect_params(gateway)), BridgeConfig(gateway=settings), ""
    )
    try:
        hello, error = await asyncio.wait_for(rt.connect(cfg), 5)
        assert error is None and hello is not None and rt.connected
        await asyncio.wait_for(announced.wait(), 5)
        assert rt._loop_task is not None and not rt._loop_task.done()  # the socket is read
    finally:
        await asyncio.wait_for(rt.close(), 10)  # the pending delivery is cut
    assert not rt.connected
    await wait_until(lambda: not gateway.state.connections, 5)
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway")]
    assert left == [], left


# --- ownership and event delivery ------------------------------------------------------------


async def test_runtime_belongs_to_its_principal(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    # two configured client tokens: two principals
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_CLIENT_TOKENS="alice-token,mallory-token")
    bp = await start_bridge(env=env, config=gw_config(tmp_path), tmp=tmp_path)
    alice = {"Authorization": "Bearer alice-token"}
    mallory = {"Authorization": "Bearer mallory-token"}
    res = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway), alice
    )
    assert res["ok"] is True
    stolen = await result_of(
        http,
        bp.rpc_url,
        "xworkmate.gateway.request",
        {"runtimeId": "rt-1", "method": "health"},
        mallory,
    )
    assert stolen["error"]["code"] == "OFFLINE"
    await result_of(
        http, bp.rpc_url, "xworkmate.gateway.disconnect", {"runtimeId": "rt-1"}, mallory
    )
    turn = await result_of(http, bp.rpc_url, "session.message", turn_params("m1", "hi"), mallory)
    assert turn["success"] is False and turn["error"] == "gateway not connected"
    assert len(gateway.state.connections) == 1
    mine = await result_of(
        http,
        bp.rpc_url,
        "xworkmate.gateway.request",
        {"runtimeId": "rt-1", "method": "health"},
        alice,
    )
    assert mine["ok"] is True


async def test_new_bearers_cannot_make_runtimes_past_the_bridge_wide_cap(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    # a loopback bridge without a token takes any bearer: each new one a principal
    cfg = gw_config(tmp_path, max_runtimes=2)
    bp = await start_bridge(env=base_env(), config=cfg, tmp=tmp_path)

    async def connect(bearer: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {bearer}"}
        params = connect_params(gateway)
        return await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", params, headers)

    assert (await connect("one"))["ok"] and (await connect("two"))["ok"]
    refused = await connect("three")
    assert refused["ok"] is False and refused["snapshot"] is None
    assert refused["error"] == {
        "message": "too many gateway runtimes on this bridge",
        "code": "TOO_MANY",
    }
    assert (await connect("one"))["ok"]  # a runtime already held connects again
    assert len(gateway.state.connections) == 2
    async with http.get(f"{bp.url}/metrics") as resp:
        text = await resp.text()
    assert 'xwm_gateway_connects_refused_total{reason="bridge"} 1.0' in text
    entries = [e for e in log_entries(bp.logs) if "gateway.max_runtimes" in str(e.get("msg"))]
    assert len(entries) == 1 and entries[0]["limit"] == 2


async def test_events_go_only_to_the_owners_live_websockets(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(env=base_env(), config=gw_config(tmp_path), tmp=tmp_path)
    owner = await open_ws(http, bp.ws_url, {"Authorization": "Bearer owner"})
    owner2 = await open_ws(http, bp.ws_url, {"Authorization": "Bearer owner"})
    other = await open_ws(http, bp.ws_url, {"Authorization": "Bearer other"})
    # connected over SSE first: that response is finished when the later events arrive
    events = await sse(
        http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway, "sse-rt")
    )
    assert events[-1]["result"]["ok"] is True
    res = await owner.call("xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True
    await owner2.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"})
    await gateway._broadcast("custom.event", {"hello": 1})
    await wait_until(lambda: owner.pushes("custom.event") and owner2.pushes("custom.event"), 5)
    push = owner.pushes("custom.event")[0]
    assert push["payload"] == {"hello": 1} and push["sequence"] > 0
    # a push to "other" would come from the fan-out that reached the owner's sockets, so
    # before the answer to a request "other" sends now (one ordered sender per socket)
    await other.call("acp.capabilities", {})
    assert other.notes == []
    # the bridge is fine after delivering to a finished SSE response's runtime
    ok = await owner.call("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"})
    assert ok["ok"] is True
    for c in (owner, owner2, other):
        await c.close()


async def test_idle_runtime_is_closed(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path, idle_ttl=0.6), tmp=tmp_path)
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True
    await wait_until(lambda: not gateway.state.connections, 5)
    out = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
    )
    assert out["error"]["code"] == "OFFLINE"


async def test_live_owner_websocket_keeps_runtime(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path, idle_ttl=0.4), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"] is True
    # a runtime connected after it, without a live owner socket, is reaped: that reaper
    # pass found "rt-1" idle for longer than the TTL too, and kept it for its socket
    other = FakeGateway(FakeGatewayState())
    await other.start()
    try:
        res = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(other, "rt-2")
        )
        assert res["ok"] is True
        await wait_until(lambda: other.state.handshakes_ok == 1 and not other.state.connections)
    finally:
        await other.stop()
    assert len(gateway.state.connections) == 1 and gateway.state.connects == 1
    await ws.close()
    await wait_until(lambda: not gateway.state.connections, 5)


# --- liveness and reconnect --------------------------------------------------------------------


async def test_gateway_restart_is_survived(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"] is True
    await gateway.shutdown()
    await wait_until(lambda: gateway.state.handshakes_ok >= 2, 10)
    await wait_until(lambda: ws.snapshots()[-1]["status"] == "connected", 5)
    statuses = [s["statusText"] for s in ws.snapshots()]
    assert "Disconnected" in statuses
    assert ws.pushes("shutdown")
    turn = await ws.call("session.message", turn_params("after-restart", "still there"))
    assert turn["success"] is True and turn["output"] == "FAKE-GW says: still there"
    await ws.close()


async def test_silent_gateway_is_detected_by_tick_timeout(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gw = FakeGateway(FakeGatewayState(tick_interval_ms=150))
    await gw.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
        res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gw))
        assert res["ok"] is True
        gw.state.silent = True
        # no frame for 2 ticks (0.3 s): the bridge gives the socket up; it redials after
        # a backoff, so the gateway speaks again before that dial arrives
        await wait_until(lambda: any("no frame for 0.3s" in line for line in bp.logs), 10)
        gw.state.silent = False
        await wait_until(lambda: gw.state.handshakes_ok >= 2, 10)
        out = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
        )
        assert out["ok"] is True, out
    finally:
        await gw.stop()


async def test_pending_request_fails_fast_when_socket_drops(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    gateway.state.reply_delay = 30
    call = asyncio.ensure_future(
        result_of(
            http,
            bp.rpc_url,
            "xworkmate.gateway.request",
            {"runtimeId": "rt-1", "method": "health", "timeoutMs": 60000},
        )
    )
    await wait_until(lambda: bool(gateway.state.requests), 5)
    started = time.monotonic()
    await gateway.shutdown()
    out = await asyncio.wait_for(call, 5)
    assert out["error"] == {"message": "socket closed", "code": "SOCKET_CLOSED"}
    assert time.monotonic() - started < 3


async def test_sequence_gap_is_logged(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    await gateway._broadcast("a", {})
    gateway.state.seq_gap = 3
    await gateway._broadcast("b", {})
    await wait_until(lambda: any("sequence gap detected" in m for m in ws.logs()), 5)
    await ws.close()


# --- gateway-mode turns ----------------------------------------------------------------------


async def test_gateway_turn_streams_deltas_and_final(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    caps = await result_of(http, bp.rpc_url, "acp.capabilities", {})
    assert {g["providerId"] for g in caps["gatewayProviders"]} == {"local", "openclaw"}
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    events = await sse(http, bp.rpc_url, "session.start", turn_params("g1", "hello gateway world"))
    final = events[-1]["result"]
    assert final["success"] is True
    assert final["mode"] == "gateway-chat"
    assert final["output"] == "FAKE-GW says: hello gateway world"
    assert final["stopReason"] == "stop" and final["turnId"].startswith("turn-")
    assert final["sessionKey"] == "agent:main:xwm-g1"
    updates = [e["params"] for e in events[:-1] if e.get("method") == "session.update"]
    assert updates[0]["event"] == "started"
    deltas = [u["delta"] for u in updates if u.get("type") == "delta"]
    assert "".join(deltas) == "FAKE-GW says: hello gateway world"
    assert updates[-1]["type"] == "final"
    assert updates[-1]["message"] == "FAKE-GW says: hello gateway world"
    assert [u["seq"] for u in updates] == sorted(u["seq"] for u in updates)
    sent = [r for r in gateway.state.requests if r["method"] == "chat.send"]
    assert sent[0]["params"]["idempotencyKey"] == f"xwm-{final['turnId']}"
    assert sent[0]["params"]["message"] == "hello gateway world"
    chat_runs = [
        e
        for e in events
        if e.get("method") == "xworkmate.gateway.push"
        and e["params"]["event"]["event"] == "chat.run"
    ]
    assert chat_runs and chat_runs[-1]["params"]["event"]["payload"]["terminal"] is True


async def test_a_turn_on_the_owner_s_websocket_gets_each_push_once(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    """A gateway turn sent on the WebSocket that connected the runtime: the run's
    pushes reach that socket once. The turn's own notify (a wrapper of the
    connection's) was a second target beside the connection, so every push, log line
    and snapshot of the run arrived twice."""
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    res = await ws.call("session.message", turn_params("w1", "hello there"))
    assert res["success"] is True and res["output"] == "FAKE-GW says: hello there"
    sequences = [e["sequence"] for e in ws.pushes("chat")]
    assert sequences and len(sequences) == len(set(sequences))
    assert [e["payload"]["state"] for e in ws.pushes("chat")].count("final") == 1
    # the connection keeps getting the runtime's pushes after the turn (it used it)
    await gateway._broadcast("presence", {})
    await wait_until(lambda: len(ws.pushes("presence")) == 1, 5)
    await ws.close()


async def test_gateway_turn_ignores_other_sessions_runs(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    one, two = await asyncio.gather(
        result_of(http, bp.rpc_url, "session.message", turn_params("p1", "slow:300 first")),
        result_of(http, bp.rpc_url, "session.message", turn_params("p2", "slow:300 second")),
    )
    assert one["output"] == "FAKE-GW says: first"
    assert two["output"] == "FAKE-GW says: second"


async def test_gateway_turn_cancel_aborts_the_run(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    rid = await ws.send("session.message", turn_params("c1", "slow:6000 a b c d e f g h"))
    # the run is under way: its first event reached the owner's socket
    await wait_until(
        lambda: any(e["payload"].get("state") == "status" for e in ws.pushes("chat")), 5
    )
    cancel = await ws.call("session.cancel", {"sessionId": "c1"})
    assert cancel["cancelled"] is True
    reply = (await ws.reply(rid, 10))["result"]
    assert reply["success"] is False and reply["cancelled"] is True and reply["aborted"] is True
    assert reply["mode"] == "gateway-chat"
    aborts = [r for r in gateway.state.requests if r["method"] == "chat.abort"]
    assert aborts[0]["params"] == {
        "sessionKey": "agent:main:xwm-c1",
        "runId": f"xwm-{reply['turnId']}",
    }
    assert aborts[0]["params"]["runId"] in gateway.state.aborted
    await ws.close()


async def test_a_cancel_sent_again_leaves_the_chat_abort(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    gateway: FakeGateway,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn's cancel is sent again until its executor takes it (one can be lost in a
    third-party ``asyncio.wait_for``); the executor says it arrived, so its
    ``chat.abort`` is not cut short (``aborted: true``). RESEND 0: a re-send would come
    at the next loop iteration."""
    monkeypatch.setattr(handles, "RESEND", 0)
    await test_gateway_turn_cancel_aborts_the_run(start_bridge, http, gateway, tmp_path)


async def test_gateway_turn_deadline_aborts_upstream(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path, turn_timeout=1.0), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    started = time.monotonic()
    res = await result_of(
        http, bp.rpc_url, "session.message", turn_params("t1", "slow:9000 a b c d e f")
    )
    assert time.monotonic() - started < 5
    assert res["success"] is False and res["timedOut"] is True and res["aborted"] is True
    assert "timed out" in res["error"]
    assert any(r["method"] == "chat.abort" for r in gateway.state.requests)


async def test_gateway_turn_fails_when_the_connection_drops_mid_run(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    call = asyncio.ensure_future(
        result_of(http, bp.rpc_url, "session.message", turn_params("d1", "slow:9000 a b c d"))
    )
    await wait_until(lambda: any(r["method"] == "chat.send" for r in gateway.state.requests), 5)
    started = time.monotonic()
    await gateway.shutdown()
    res = await asyncio.wait_for(call, 10)
    assert res["success"] is False and res["error"] == "gateway connection lost during the run"
    assert time.monotonic() - started < 4


async def test_a_gateway_turn_fails_at_once_when_its_socket_drops(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    # the turn wakes on the runtime's "socket lost" signal, not on a poll: it ends
    # well before a poll of 1 s (started when the run's stream began) would notice
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    call = asyncio.ensure_future(
        result_of(http, bp.rpc_url, "session.message", turn_params("d2", "slow:30000 a b c d"))
    )
    # the first streamed event: the turn is in its stream, waiting for the next one
    await wait_until(lambda: gateway.state.seq >= 1 and bool(gateway.state.connections), 5)
    for ws in list(gateway.state.connections):
        await ws.close(1011, "dropped")  # no shutdown event: the socket just goes
    res = await asyncio.wait_for(asyncio.shield(call), 0.5)
    assert res["success"] is False and res["error"] == "gateway connection lost during the run"


async def test_a_run_whose_socket_dropped_is_aborted_once_the_runtime_is_back(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    """The socket drops mid-run: the turn fails at once, but the gateway keeps the run
    going (OpenClaw does not end a run when its client goes), and one whose model is
    down retries for ever, holding the session key. Once the runtime has reconnected,
    the bridge sends that run's ``chat.abort``; nothing ended it before."""
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    call = asyncio.ensure_future(
        result_of(http, bp.rpc_url, "session.message", turn_params("d3", "slow:30000 a b c d"))
    )
    await wait_until(lambda: gateway.state.seq >= 1 and bool(gateway.state.connections), 5)
    [send] = [r for r in gateway.state.requests if r["method"] == "chat.send"]
    for ws in list(gateway.state.connections):
        await ws.close(1011, "dropped")
    res = await asyncio.wait_for(call, 5)
    assert res["success"] is False and res["error"] == "gateway connection lost during the run"
    await wait_until(lambda: gateway.state.handshakes_ok >= 2, 10)  # reconnected
    await wait_until(lambda: any(r["method"] == "chat.abort" for r in gateway.state.requests), 10)
    [abort] = [r for r in gateway.state.requests if r["method"] == "chat.abort"]
    assert abort["params"] == {"sessionKey": send["params"]["sessionKey"], "runId": res["runId"]}
    assert res["runId"] in gateway.state.aborted


async def test_a_chat_send_whose_socket_dropped_is_aborted_once_the_runtime_is_back(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    """The socket drops after ``chat.send`` was written, before its answer: the run may
    have started under its idempotency key; it is aborted once the runtime is back."""
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    assert (
        await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    )["ok"]
    gateway.state.reply_delay = 2.0  # chat.send is read, and not answered yet
    call = asyncio.ensure_future(
        result_of(http, bp.rpc_url, "session.message", turn_params("d4", "a b c"))
    )
    await wait_until(lambda: any(r["method"] == "chat.send" for r in gateway.state.requests), 5)
    [send] = [r for r in gateway.state.requests if r["method"] == "chat.send"]
    gateway.state.reply_delay = 0
    for ws in list(gateway.state.connections):
        await ws.close(1011, "dropped")
    res = await asyncio.wait_for(call, 5)
    assert res["success"] is False, res
    await wait_until(lambda: any(r["method"] == "chat.abort" for r in gateway.state.requests), 10)
    [abort] = [r for r in gateway.state.requests if r["method"] == "chat.abort"]
    assert abort["params"] == {
        "sessionKey": send["params"]["sessionKey"],
        "runId": send["params"]["idempotencyKey"],
    }


async def test_gateway_turn_without_runtime(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge()
    events = await sse(http, bp.rpc_url, "session.message", turn_params("n1", "hi"))
    final = events[-1]["result"]
    assert final["success"] is False and final["error"] == "gateway not connected"
    assert final["mode"] == "gateway-chat"
    assert events[-2]["params"]["error"] is True


async def test_requests_go_out_as_text_frames(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    """Issue 15 item 3: a gateway that reads only text frames answers every request."""
    gateway.state.text_only = True
    bp = await start_bridge(config=gw_config(tmp_path, request_timeout=2), tmp=tmp_path)
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True
    out = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
    )
    assert out["ok"] is True, out
    assert gateway.state.binary_frames == 0


async def test_connect_over_websocket_emits_each_snapshot_once(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    """Issue 15 item 4: one `connecting` snapshot (as the original), one `connected`,
    and each log line once, on the WebSocket the connect came on."""
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    client = await open_ws(http, bp.ws_url)
    try:
        res = await client.call("xworkmate.gateway.connect", connect_params(gateway))
        assert res["ok"] is True
        # every notification of the connect is written before its reply; a round trip on
        # the same socket then flushes anything sent after it
        await client.call("acp.capabilities", {})
        statuses = [s["status"] for s in client.snapshots()]
        assert statuses == ["connecting", "connected"], statuses
        logs = client.logs()
        assert len(logs) == len(set(logs)), logs
    finally:
        await client.close()


# --- client-chosen destinations (issue 16 item 10) -------------------------------------------


async def test_local_runtimes_dial_only_loopback_and_configured_hosts_by_default(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    params = {
        "runtimeId": "far",
        "gatewayProviderId": "local",
        "endpoint": {"host": "198.51.100.7", "port": 22},
    }
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", params)
    assert res["ok"] is False and res["error"]["code"] == "HOST_NOT_ALLOWED"
    assert res["snapshot"] is None  # refused before any dial


async def test_allowed_hosts_in_config_keep_working(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    config = gw_config(tmp_path, allowed_hosts=[f"127.0.0.1:{gateway.port}"])
    bp = await start_bridge(config=config, tmp=tmp_path)
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True
    other = {**connect_params(gateway, "rt-2"), "endpoint": {"host": "127.0.0.1", "port": 1}}
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", other)
    assert res["error"]["code"] == "HOST_NOT_ALLOWED"  # the list is exact once it is set


async def test_a_failed_dial_does_not_tell_open_ports_from_closed_ones(
    start_bridge: StartBridge, http: aiohttp.ClientSession, serve_app: Any, tmp_path: Path
) -> None:
    from aiohttp import web

    from tests.conftest import closed_port

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="not a gateway")

    app = web.Application()
    app.router.add_get("/{tail:.*}", plain)
    open_port = int((await serve_app(app)).rsplit(":", 1)[1])
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    client = await open_ws(http, bp.ws_url)
    try:
        answers = []
        for i, port in enumerate((closed_port(), open_port)):
            params = {
                "runtimeId": f"probe-{i}",
                "gatewayProviderId": "local",
                "endpoint": {"host": "127.0.0.1", "port": port},
            }
            answers.append(await client.call("xworkmate.gateway.connect", params))
        errors = [a["error"] for a in answers]
        assert (
            errors[0]
            == errors[1]
            == {
                "message": "gateway connection failed",
                "code": "SOCKET_FAILURE",
            }
        )
        assert answers[0]["snapshot"]["lastError"] == answers[1]["snapshot"]["lastError"]
        told = " ".join(client.logs()).lower()
        for detail in ("errno", "refused", "connect call", "status", "http", "invalid"):
            assert detail not in told, client.logs()
    finally:
        await client.close()


async def test_connect_with_an_out_of_range_port_is_a_clear_error(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway
) -> None:
    bp = await start_bridge()
    params = {**connect_params(gateway), "endpoint": {"host": "127.0.0.1", "port": 99999}}
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", params)
    assert res["ok"] is False and res["snapshot"] is None, res
    assert res["error"]["code"] == "INVALID_ENDPOINT", res
    assert "65535" in res["error"]["message"]


async def test_frames_the_bridge_ignores_are_logged_and_counted(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    await gateway.send_raw(
        "not json",
        b"\xff\xfe",  # binary, not JSON
        "[1, 2]",
        '{"type": "bogus"}',
        '{"type": "res", "id": "nobody-asked", "ok": true}',
        # a binary frame holding a valid event is a frame like any other (§5.2)
        orjson.dumps({"type": "event", "event": "after.garbage", "payload": {}, "seq": 0}),
    )
    await wait_until(lambda: bool(ws.pushes("after.garbage")), 5)

    async def counted() -> None:
        async with http.get(f"{bp.url}/metrics") as resp:
            text = await resp.text()
        prefix = "xwm_gateway_frames_ignored_total{"
        out = {}
        for line in text.splitlines():
            if line.startswith(prefix):
                labels, value = line[len(prefix) :].split("} ")
                out[labels.split('"')[1]] = float(value)
        assert out == {"invalid_json": 2, "not_a_frame": 2, "unknown_response": 1}, out

    await counted()  # read in order: the push above came after every ignored frame
    health = await result_of(http, bp.rpc_url, "bridge.health", {})
    (rt,) = [g for g in health["gateways"] if g["runtimeId"] == "rt-1"]
    assert rt["ignoredFrames"] == 5
    entries = [e for e in log_entries(bp.logs) if e.get("msg") == "gateway frame ignored"]
    assert {e["reason"] for e in entries} == {"invalid_json", "not_a_frame", "unknown_response"}
    assert not any("Traceback" in line for line in bp.logs)
    # the socket is still good
    out = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
    )
    assert out["ok"] is True
    await ws.close()


async def test_frames_ignored_during_the_handshake_are_counted_and_logged(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    # each written before the challenge and again before hello-ok (while the bridge
    # waits for its connect's res): 2 x invalid_json, 2 x not_a_frame, 2 x unknown_response
    gateway.state.handshake_noise = [
        "not json",
        '{"type": "bogus"}',
        '{"type": "res", "id": "nobody-asked", "ok": true}',
    ]
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
    assert res["ok"] is True, res
    async with http.get(f"{bp.url}/metrics") as resp:
        text = await resp.text()
    prefix = "xwm_gateway_frames_ignored_total{"
    counts = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            labels, value = line[len(prefix) :].split("} ")
            counts[labels.split('"')[1]] = float(value)
    assert counts == {"invalid_json": 2, "not_a_frame": 2, "unknown_response": 2}, counts
    health = await result_of(http, bp.rpc_url, "bridge.health", {})
    (rt,) = [g for g in health["gateways"] if g["runtimeId"] == "rt-1"]
    assert rt["ignoredFrames"] == 6
    entries = [e for e in log_entries(bp.logs) if e.get("msg") == "gateway frame ignored"]
    # rate-limited as after the handshake: the first of each reason per socket is a
    # warning, the second a debug line (below this daemon's log level)
    assert all(e["level"] == "warning" for e in entries), entries
    assert sorted(e["reason"] for e in entries) == [
        "invalid_json",
        "not_a_frame",
        "unknown_response",
    ], entries


async def test_an_oversized_frame_drops_the_socket_and_the_runtime_reconnects(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path, max_message_bytes=65536), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    gateway.state.reply_delay = 30  # a request in flight when the big frame comes
    rid = await ws.send("xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"})
    await wait_until(lambda: bool(gateway.state.requests), 5)
    gateway.state.reply_delay = 0
    big = orjson.dumps({"type": "event", "event": "big", "payload": {"x": "y" * 100_000}})
    await gateway.send_raw(big.decode())
    reply = await ws.reply(rid, 5)  # fails at once, not at its 15 s timeout
    assert reply["result"]["error"] == {"message": "socket closed", "code": "SOCKET_CLOSED"}
    await wait_until(lambda: gateway.state.handshakes_ok >= 2, 10)
    await wait_until(lambda: ws.snapshots()[-1]["status"] == "connected", 5)
    assert not ws.pushes("big")
    assert not any("Traceback" in line for line in bp.logs)
    await ws.close()


async def test_a_gateway_that_drops_every_connection_gets_a_growing_backoff(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # hello-ok, then the socket closes at once, again and again (a gateway that accepts
    # and then refuses the client): the redials must back off, not come every
    # backoff_initial because each hello-ok reset the backoff
    gw = FakeGateway(FakeGatewayState(drop_after_connect=1_000_000))
    await gw.start()
    try:
        bp = await start_bridge(
            config=gw_config(tmp_path, backoff_initial=0.1, backoff_max=3.2), tmp=tmp_path
        )
        ws = await open_ws(http, bp.ws_url)
        assert (await ws.call("xworkmate.gateway.connect", connect_params(gw)))["ok"] is True

        def delays() -> list[float]:
            prefix = "scheduling reconnect in "
            return [
                float(m[len(prefix) :].split("s")[0]) for m in ws.logs() if m.startswith(prefix)
            ]

        await wait_until(lambda: len(delays()) >= 4, 15)
        # ceilings 0.1, 0.2, 0.4, 0.8, each jittered into [ceiling/2, ceiling] (only a socket
        # up for backoff_max, 3.2 s, would reset them)
        assert delays()[3] >= 0.4, delays()
        gw.state.drop_after_connect = 0
        await ws.call("xworkmate.gateway.disconnect", {"runtimeId": "rt-1"})
        await ws.close()
    finally:
        await gw.stop()


async def test_concurrent_connects_of_one_runtime_leave_one_connection(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    results = await asyncio.gather(
        *(
            result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gateway))
            for _ in range(3)
        )
    )
    assert all(r["ok"] is True for r in results), results
    # a connect that overlaps one in its handshake joins it; one that comes later closes
    # the socket of the one before it: one is left, and it works
    await wait_until(lambda: len(gateway.state.connections) == 1, 5)
    out = await result_of(
        http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
    )
    assert out["ok"] is True
    assert len(gateway.state.connections) == 1 and 1 <= gateway.state.handshakes_ok <= 3


async def active_calls(http: aiohttp.ClientSession, rpc_url: str, runtime_id: str) -> int:
    health = await result_of(http, rpc_url, "bridge.health", {})
    calls = [g["activeCalls"] for g in health["gateways"] if g["runtimeId"] == runtime_id]
    return calls[0] if calls else 0


async def test_a_second_connect_joins_the_handshake_in_flight(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    held = FakeGateway(FakeGatewayState(hold_hello=asyncio.Event()))
    await held.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path, hello_timeout=60), tmp=tmp_path)
        first = asyncio.ensure_future(
            result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(held))
        )
        await wait_until(lambda: held.state.connects == 1, 5)  # in its handshake
        second = asyncio.ensure_future(
            result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(held))
        )

        async def both_waiting() -> bool:
            return await active_calls(http, bp.rpc_url, "rt-1") == 2

        await eventually(both_waiting)
        held.state.hold_hello.set()  # type: ignore[union-attr]
        results = await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert all(r["ok"] is True for r in results), results
        # one dial, one handshake, shared: no second socket dialed behind the first
        assert held.state.connects == 1 and held.state.handshakes_ok == 1
        out = await result_of(
            http, bp.rpc_url, "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health"}
        )
        assert out["ok"] is True
    finally:
        held.state.hold_hello.set()  # type: ignore[union-attr]
        await held.stop()


async def test_a_disconnect_ends_a_connect_and_the_one_that_joined_it(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    held = FakeGateway(FakeGatewayState(hold_hello=asyncio.Event()))  # hello never comes
    await held.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path, hello_timeout=60), tmp=tmp_path)
        calls = [
            asyncio.ensure_future(
                result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(held))
            )
        ]
        await wait_until(lambda: held.state.connects == 1, 5)
        calls.append(
            asyncio.ensure_future(
                result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(held))
            )
        )

        async def both_waiting() -> bool:
            return await active_calls(http, bp.rpc_url, "rt-1") == 2

        await eventually(both_waiting)
        await result_of(http, bp.rpc_url, "xworkmate.gateway.disconnect", {"runtimeId": "rt-1"})
        # the guard only catches a hang: far below the held handshake's 60 s
        results = await asyncio.wait_for(asyncio.gather(*calls), 5)
        for res in results:
            assert res["ok"] is False, results
            assert res["error"] == {"message": "socket reset", "code": "SOCKET_RESET"}, results
        assert held.state.connects == 1  # the joined connect did not dial on its own
        await wait_until(lambda: not held.state.connections, 5)
    finally:
        held.state.hold_hello.set()  # type: ignore[union-attr]
        await held.stop()


async def test_gateway_credentials_never_reach_logs_or_notifications(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    seed = signing.b64url(Ed25519PrivateKey.generate().private_bytes_raw())
    secrets = ["wrong-token-6c1f", "device-token-93ab", "password-4d2e", seed]
    params = connect_params(gateway, token=secrets[0])
    params["auth"].update(deviceToken=secrets[1], password=secrets[2])
    params["identity"] = {"deviceId": "dev-1", "privateKeyBase64Url": secrets[3]}
    res = await ws.call("xworkmate.gateway.connect", params)
    assert res["ok"] is False and res["error"]["details"] == {"code": "AUTH_TOKEN_MISMATCH"}
    good = await ws.call("xworkmate.gateway.connect", connect_params(gateway, "rt-2"))
    assert good["ok"] is True
    seen = orjson.dumps([res, good, ws.notes]).decode() + "\n".join(bp.logs)
    for secret in [*secrets, GW_TOKEN]:
        assert secret not in seen, secret
    await ws.close()


async def test_disconnect_stops_the_reconnect_loop(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    gw = FakeGateway(FakeGatewayState(drop_after_connect=1_000_000))
    await gw.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
        res = await result_of(http, bp.rpc_url, "xworkmate.gateway.connect", connect_params(gw))
        assert res["ok"] is True
        await wait_until(lambda: gw.state.connects >= 3, 10)  # redialing after each drop
        await result_of(http, bp.rpc_url, "xworkmate.gateway.disconnect", {"runtimeId": "rt-1"})
        dials = gw.state.connects
        await prove_no_redial(http, bp.rpc_url)  # a sibling with the same backoff redialed
        assert gw.state.connects == dials
        health = await result_of(http, bp.rpc_url, "bridge.health", {})
        (rt,) = [g for g in health["gateways"] if g["runtimeId"] == "rt-1"]
        assert rt["state"] == "offline"
    finally:
        await gw.stop()


async def test_disconnect_fails_a_request_in_flight_at_once(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    bp = await start_bridge(config=gw_config(tmp_path), tmp=tmp_path)
    ws = await open_ws(http, bp.ws_url)
    assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway)))["ok"]
    gateway.state.reply_delay = 30
    rid = await ws.send(
        "xworkmate.gateway.request", {"runtimeId": "rt-1", "method": "health", "timeoutMs": 60000}
    )
    await wait_until(lambda: bool(gateway.state.requests), 5)
    assert await ws.call("xworkmate.gateway.disconnect", {"runtimeId": "rt-1"}) == {
        "accepted": True
    }
    reply = await ws.reply(rid, 5)  # not at its 60 s timeout
    assert reply["result"] == {
        "ok": False,
        "payload": None,
        "error": {"message": "socket reset", "code": "SOCKET_RESET"},
    }
    await wait_until(lambda: not gateway.state.connections, 5)  # the socket is closed
    assert ws.snapshots()[-1]["status"] == "offline"
    await ws.close()


async def test_shutdown_closes_every_runtime_within_its_grace(
    start_bridge: StartBridge, http: aiohttp.ClientSession, gateway: FakeGateway, tmp_path: Path
) -> None:
    held = FakeGateway(FakeGatewayState(hold_hello=asyncio.Event()))  # hello never comes
    flaky = FakeGateway(FakeGatewayState(drop_after_connect=1_000_000))
    await held.start()
    await flaky.start()
    try:
        bp = await start_bridge(config=gw_config(tmp_path, hello_timeout=60), tmp=tmp_path)
        ws = await open_ws(http, bp.ws_url)
        assert (await ws.call("xworkmate.gateway.connect", connect_params(gateway, "up")))["ok"]
        assert (await ws.call("xworkmate.gateway.connect", connect_params(flaky, "redial")))["ok"]
        hanging = await ws.send("xworkmate.gateway.connect", connect_params(held, "hanging"))
        await wait_until(lambda: held.state.connects == 1 and flaky.state.connects >= 2, 10)
        # the guard only catches a hang: far below the hanging handshake's 60 s
        await asyncio.wait_for(bp.stop(), 15)
        for gw in (gateway, held, flaky):
            await wait_until(lambda gw=gw: not gw.state.connections, 5)  # type: ignore[misc]
        left = [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway")]
        assert left == [], left
        assert (
            hanging not in ws.replies
            or "error" in ws.replies[hanging]
            or (ws.replies[hanging]["result"]["ok"] is False)
        )
        await ws.close()
    finally:
        held.state.hold_hello.set()  # type: ignore[union-attr]
        await held.stop()
        await flaky.stop()
