"""``/console``: the page, its headers and files, and the WebSocket's first-frame auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge, base_env, provider_env


def auth_frame(token: str) -> str:
    return orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "console.auth", "params": {"token": token}}
    ).decode()


async def test_page_and_files_with_strict_headers(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge()
    async with http.get(f"{bp.url}/console") as resp:
        assert resp.status == 200
        body = await resp.text()
        csp = resp.headers["Content-Security-Policy"]
        assert resp.headers["X-Frame-Options"] == "DENY"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "no-referrer"
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert "require-trusted-types-for 'script'; trusted-types 'none'" in csp
    # no inline script, no third-party host, no token in the page
    assert "<script>" not in body and "http://" not in body and "https://" not in body
    assert TOKEN not in body
    for name, kind in (("app.js", "javascript"), ("console.css", "css"), ("icon.svg", "svg")):
        async with http.get(f"{bp.url}/console/static/{name}") as resp:
            assert resp.status == 200 and kind in resp.headers["Content-Type"]
            assert resp.headers["X-Frame-Options"] == "DENY"
            etag = resp.headers["ETag"]
        async with http.get(
            f"{bp.url}/console/static/{name}", headers={"If-None-Match": etag}
        ) as resp:
            assert resp.status == 304
    for bad in ("nope.js", "..%2Fhttp.py", ".hidden"):
        async with http.get(f"{bp.url}/console/static/{bad}") as resp:
            assert resp.status == 404, bad
    async with http.post(f"{bp.url}/console") as resp:
        assert resp.status == 405


async def test_websocket_needs_the_token_first(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    env = provider_env(fake_upstream.url, INTERNAL_SERVICE_TOKEN="secret-upstream-value")
    bp = await start_bridge(env=env)
    url = f"{bp.url}/console/ws"
    async with http.ws_connect(url) as ws:
        await ws.send_str(auth_frame("wrong-token"))
        reply = orjson.loads((await ws.receive(timeout=5)).data)
        assert reply["error"]["code"] == -32001
        closed = await ws.receive(timeout=5)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 4401
    async with http.ws_connect(url) as ws:  # any other method first is refused
        await ws.send_str(
            orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.list"}).decode()
        )
        reply = orjson.loads((await ws.receive(timeout=5)).data)
        assert reply["error"]["code"] == -32001
    async with http.ws_connect(url) as ws:
        await ws.send_str(auth_frame(TOKEN))
        hello = orjson.loads((await ws.receive(timeout=5)).data)["result"]
        assert hello["authenticated"] is True and hello["tokenRequired"] is True
        await ws.send_str(
            orjson.dumps({"jsonrpc": "2.0", "id": 2, "method": "bridge.config"}).decode()
        )
        raw = (await ws.receive(timeout=5)).data
        assert "secret-upstream-value" not in raw and TOKEN not in raw
        assert orjson.loads(raw)["id"] == 2


async def test_a_long_refused_origin_is_cut_in_the_answer(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge()
    origin = "https://evil.example/" + "a" * 4000
    async with http.get(f"{bp.url}/console/ws", headers={"Origin": origin}) as resp:
        assert resp.status == 403
        error = orjson.loads(await resp.read())["error"]
    assert error == {"code": -32003, "message": f"origin not allowed: {origin[:200]}"}


async def test_origin_rules_apply(start_bridge: StartBridge, http: aiohttp.ClientSession) -> None:
    bp = await start_bridge()
    url = f"{bp.url}/console/ws"
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        async with http.ws_connect(url, headers={"Origin": "https://evil.example"}):
            pass
    assert err.value.status == 403
    # its own origin on a loopback address is fine (and the default allow-list has it)
    async with http.ws_connect(url, headers={"Origin": bp.url}) as ws:
        await ws.send_str(auth_frame(TOKEN))
        assert orjson.loads((await ws.receive(timeout=5)).data)["result"]["authenticated"]
    # a DNS-rebinding page is same-origin with the bridge under its own name: with a
    # token that is the page's own origin (as behind a proxy), and the token the check
    headers = {"Origin": "http://rebind.example:1", "Host": "rebind.example:1"}
    async with http.ws_connect(url, headers=headers) as ws:
        await ws.send_str(auth_frame(""))
        assert orjson.loads((await ws.receive(timeout=5)).data)["error"]["code"] == -32001
    # without a token, a Host such a page can have is refused
    open_bp = await start_bridge(env=base_env())
    with pytest.raises(aiohttp.WSServerHandshakeError):
        async with http.ws_connect(f"{open_bp.url}/console/ws", headers=headers):
            pass


async def test_no_token_bridge_works_without_one(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=base_env())
    async with http.ws_connect(f"{bp.url}/console/ws") as ws:
        await ws.send_str(auth_frame(""))
        hello = orjson.loads((await ws.receive(timeout=5)).data)["result"]
        assert hello["authenticated"] is True and hello["tokenRequired"] is False


async def test_console_can_be_disabled(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config={"console": {"enabled": False}}, tmp=tmp_path)
    for path in ("/console", "/console/static/app.js", "/console/ws"):
        async with http.get(f"{bp.url}{path}") as resp:
            assert resp.status == 404, path


async def test_a_cancel_passes_the_console_in_flight_limit(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    fake_upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's cancel is what a console full of stuck requests needs: it passes
    the per-connection limit (up to twice it), as on every other connection; others
    get -32004 and are counted."""
    import asyncio

    from tests.conftest import EXPLICIT, wait_until
    from xwm_bridge.transport import console

    monkeypatch.setattr(console, "MAX_INFLIGHT", 1)
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.ws_connect(f"{bp.url}/console/ws") as ws:
        await ws.send_str(auth_frame(TOKEN))
        await ws.receive(timeout=5)

        async def send(rid: int, method: str, params: dict[str, object]) -> None:
            frame = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
            await ws.send_str(orjson.dumps(frame).decode())

        routing = {**EXPLICIT, "explicitProviderId": "codex"}
        await send(
            1,
            "session.start",
            {"sessionId": "stuck", "taskPrompt": "slow:20000 x", "routing": routing},
        )
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        answers: dict[int, dict[str, Any]] = {}

        async def answer(rid: int) -> dict[str, Any]:
            while rid not in answers:  # notifications of the turn are skipped
                msg = orjson.loads((await asyncio.wait_for(ws.receive(), 15)).data)
                if isinstance(msg.get("id"), int):
                    answers[msg["id"]] = msg
            return answers[rid]

        await send(2, "session.list", {})
        assert (await answer(2))["error"]["code"] == -32004
        await send(3, "session.cancel", {"sessionId": "stuck"})
        assert "result" in await answer(3)  # within the 15 s, not after the 20 s turn
        assert (await answer(1))["result"]["cancelled"] is True
    async with http.get(f"{bp.url}/metrics") as resp:
        sample = 'xwm_rejected_requests_total{reason="too_many_inflight",transport="console"} 1.0'
        assert sample in (await resp.text()).splitlines()


async def _ws_refusal(
    http: aiohttp.ClientSession, url: str, origin: str, **extra: str
) -> dict[str, Any]:
    """The 403 answer of the console's WebSocket to this Origin."""
    headers = {"Origin": origin, "Connection": "Upgrade", "Upgrade": "websocket", **extra}
    headers |= {"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
    async with http.get(url, headers=headers) as resp:
        assert resp.status == 403, origin
        error: dict[str, Any] = orjson.loads(await resp.read())["error"]
    return error


async def test_the_bridge_wide_origins_do_not_open_the_console(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """On a bridge without a token, a page of any default ``allowed_origins`` entry (a
    local dev server on another port, xworkmate.svc.plus) could open the console and
    answer agents' permission requests: only the page's own origin passes now, while
    ``/acp/rpc`` keeps admitting them."""
    bp = await start_bridge(env=base_env())
    url = f"{bp.url}/console/ws"
    for origin in ("http://localhost:5173", "http://127.0.0.1:1", "https://xworkmate.svc.plus"):
        error = await _ws_refusal(http, url, origin)
        assert error == {"code": -32003, "message": f"origin not allowed: {origin}"}
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            async with http.ws_connect(url, headers={"Origin": origin}):
                pass
        assert err.value.status == 403
        frame = {"jsonrpc": "2.0", "id": 1, "method": "bridge.health"}
        headers = {"Origin": origin, "Authorization": "Bearer any"}  # any bearer: no token
        async with http.post(f"{bp.url}/acp/rpc", json=frame, headers=headers) as resp:
            assert resp.status == 200, origin  # unchanged there
            assert resp.headers["Access-Control-Allow-Origin"] == origin
            assert "result" in await resp.json()
    for origin in ("null", "file://", "http://evil.example"):
        assert (await _ws_refusal(http, url, origin))["code"] == -32003
    # the page's own origin, by address and by name (Host and Origin agree)
    port = bp.url.rsplit(":", 1)[1]
    for own, host in ((bp.url, None), (f"http://localhost:{port}", f"localhost:{port}")):
        headers = {"Origin": own} | ({"Host": host} if host else {})
        async with http.ws_connect(url, headers=headers) as ws:
            await ws.send_str(auth_frame(""))
            assert orjson.loads((await ws.receive(timeout=5)).data)["result"]["authenticated"]
    # another port of the same host is another origin
    assert (await _ws_refusal(http, url, f"http://127.0.0.1:{int(port) + 1}"))["code"] == -32003


async def test_console_allowed_origins_admit_a_listed_origin(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = {"console": {"allowed_origins": ["https://ops.example", "http://localhost:5173"]}}
    bp = await start_bridge(config=config, tmp=tmp_path)
    url = f"{bp.url}/console/ws"
    for origin in ("https://ops.example", "http://localhost:5173"):
        async with http.ws_connect(url, headers={"Origin": origin}) as ws:
            await ws.send_str(auth_frame(TOKEN))
            assert orjson.loads((await ws.receive(timeout=5)).data)["result"]["authenticated"]
    for origin in ("http://localhost:5174", "http://ops.example", "https://xworkmate.svc.plus"):
        assert (await _ws_refusal(http, url, origin))["code"] == -32003
    # a behind-a-proxy page: the Host the proxy forwards is the page's own name
    headers = {"Origin": "https://bridge.example", "Host": "bridge.example"}
    async with http.ws_connect(url, headers=headers) as ws:
        await ws.send_str(auth_frame(TOKEN))
        assert orjson.loads((await ws.receive(timeout=5)).data)["result"]["authenticated"]
    # X-Forwarded-* are not trusted
    forwarded = {"X-Forwarded-Host": "bridge.example", "X-Forwarded-Proto": "https"}
    refused = await _ws_refusal(http, url, "https://bridge.example", **forwarded)
    assert refused["code"] == -32003


async def test_a_failed_console_login_is_one_attempt_counted_and_logged(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """One token per connection: a wrong one closes it (4401) and a right one sent
    after it on the same connection is never read; every refusal is counted under
    ``transport="console"`` and logged with its reason, never the value sent."""
    from tests.conftest import wait_until

    bp = await start_bridge()
    url = f"{bp.url}/console/ws"
    guesses = ("guess-one-3f9a", "guess-two-77c1")
    for guess in guesses:
        async with http.ws_connect(url) as ws:
            await ws.send_str(auth_frame(guess))
            await ws.send_str(auth_frame(TOKEN))  # pipelined: not a second attempt
            first = orjson.loads((await ws.receive(timeout=5)).data)
            assert first["error"] == {"code": -32001, "message": "invalid bearer token"}
            closed = await ws.receive(timeout=5)
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 4401
    async with http.ws_connect(url) as ws:  # an empty token: missing, not invalid
        await ws.send_str(auth_frame(""))
        assert orjson.loads((await ws.receive(timeout=5)).data)["error"]["code"] == -32001
    async with http.ws_connect(url) as ws:  # the first frame is not console.auth
        await ws.send_str(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "x"}).decode())
        assert orjson.loads((await ws.receive(timeout=5)).data)["error"]["code"] == -32001
    with pytest.raises(aiohttp.WSServerHandshakeError):
        async with http.ws_connect(url, headers={"Origin": "http://localhost:5173"}):
            pass
    async with http.get(f"{bp.url}/metrics") as resp:
        lines = (await resp.text()).splitlines()
    sample = 'xwm_rejected_requests_total{reason="%s",transport="console"} %s'
    assert sample % ("invalid_token", "2.0") in lines
    assert sample % ("missing_token", "2.0") in lines
    assert sample % ("origin", "1.0") in lines

    def refused() -> list[dict[str, Any]]:
        lines = [orjson.loads(x) for x in bp.logs if x.startswith("{")]
        return [e for e in lines if e.get("msg") == "request rejected"]

    await wait_until(lambda: len(refused()) >= 5, within=10)
    assert [(e["transport"], e["reason"]) for e in refused()] == [
        ("console", "invalid_token"),
        ("console", "invalid_token"),
        ("console", "missing_token"),
        ("console", "missing_token"),
        ("console", "origin"),
    ]
    assert all(e["remote"] == "127.0.0.1" for e in refused())
    # the fields every "request rejected" line has (operations.md, Logs)
    assert all(e["path"] == "/console/ws" for e in refused())
    assert [e.get("ws_close", e.get("status")) for e in refused()] == [4401, 4401, 4401, 4400, 403]
    logged = "\n".join(bp.logs)
    assert not any(g in logged for g in guesses) and TOKEN not in logged


async def test_watch_max_seconds_on_the_console(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """Bad ``maxSeconds`` values are a clean -32602 on the wire (JSON has no NaN or inf:
    ``1e400`` is a parse error), a huge one is clamped and the watch starts."""
    bp = await start_bridge()
    async with http.ws_connect(f"{bp.url}/console/ws") as ws:
        await ws.send_str(auth_frame(TOKEN))
        await ws.receive(timeout=5)
        for rid, value in enumerate(("60", True, -1, 0, [], {"s": 1}), start=1):
            frame = {"jsonrpc": "2.0", "id": rid, "method": "bridge.watch"}
            await ws.send_str(orjson.dumps({**frame, "params": {"maxSeconds": value}}).decode())
            reply = orjson.loads((await ws.receive(timeout=5)).data)
            assert reply["id"] == rid and reply["error"]["code"] == -32602, value
            assert "maxSeconds" in reply["error"]["message"]
        raw = '{"jsonrpc":"2.0","id":50,"method":"bridge.watch","params":{"maxSeconds":1e400}}'
        await ws.send_str(raw)
        assert orjson.loads((await ws.receive(timeout=5)).data)["error"]["code"] == -32700
        frame = {"jsonrpc": "2.0", "id": 99, "method": "bridge.watch"}
        await ws.send_str(orjson.dumps({**frame, "params": {"maxSeconds": 1e300}}).decode())
        while True:  # the backlog (health samples) first, then the watch's live event
            event = orjson.loads((await ws.receive(timeout=5)).data)
            assert event.get("method") == "bridge.event", event
            if event["params"]["kind"] == "watch":
                assert event["params"]["type"] == "live"
                break
    assert not [line for line in bp.logs if "Traceback" in line]


async def test_console_bytes_received_counts_bytes_not_characters(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge()
    frame = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities", "params": {"pad": "ü" * 50}}
    ).decode()
    async with http.ws_connect(f"{bp.url}/console/ws") as ws:
        await ws.send_str(auth_frame(TOKEN))
        assert orjson.loads((await ws.receive(timeout=5)).data)["id"] == 0
        await ws.send_str(frame)
        assert orjson.loads((await ws.receive(timeout=5)).data)["id"] == 1
    async with http.get(f"{bp.url}/metrics") as resp:
        text = await resp.text()
    # the auth frame is not counted (read before the connection is served); UTF-8 bytes
    sample = f'xwm_bytes_received_total{{transport="console"}} {float(len(frame.encode()))}'
    assert sample in text.splitlines()


async def test_console_frames_refused_after_login_are_counted(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A frame that is not JSON-RPC, and one over the limit (closed 1009), count as on
    ``/acp``: under ``transport="console"``, each with its ``request rejected`` line."""
    from tests.conftest import wait_until

    bp = await start_bridge(config={"limits": {"max_ws_message_bytes": 2048}}, tmp=tmp_path)
    async with http.ws_connect(f"{bp.url}/console/ws") as ws:
        await ws.send_str(auth_frame(TOKEN))
        assert orjson.loads((await ws.receive(timeout=5)).data)["id"] == 0
        await ws.send_str("{not json")
        assert orjson.loads((await ws.receive(timeout=5)).data)["error"]["code"] == -32700
        await ws.send_str("x" * 4096)
        closed = await ws.receive(timeout=5)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert ws.close_code == 1009
    async with http.get(f"{bp.url}/metrics") as resp:
        lines = (await resp.text()).splitlines()
    sample = 'xwm_rejected_requests_total{reason="%s",transport="console"} 1.0'
    assert sample % "parse_error" in lines and sample % "message_too_large" in lines

    def refused() -> list[dict[str, Any]]:
        entries = [orjson.loads(x) for x in bp.logs if x.startswith("{")]
        return [e for e in entries if e.get("msg") == "request rejected"]

    await wait_until(lambda: len(refused()) >= 2, within=10)
    assert [(e["reason"], e["path"]) for e in refused()] == [
        ("parse_error", "/console/ws"),
        ("message_too_large", "/console/ws"),
    ]
    assert refused()[1]["ws_close"] == 1009
