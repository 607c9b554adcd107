"""Bearer auth, origin allow-list and bind policy (contract.md §3, §7; ARCHITECTURE.md §2)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import AUTH, ROOT, TOKEN, StartBridge, base_env

CAPS = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
MISSING = "missing bearer authorization"
INVALID = MISSING  # contract.md §3.3: one message for a missing or a wrong token
WS_UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


def forbidden(origin: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32003, "message": f"origin not allowed: {origin}"},
    }


async def post_caps(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, Any, bytes]:
    async with http.post(url, data=CAPS, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


async def assert_auth_table(
    http: aiohttp.ClientSession, url: str, cases: list[tuple[str | None, int]]
) -> None:
    for header, expected in cases:
        headers = {} if header is None else {"Authorization": header}
        status, _, body = await post_caps(http, url, headers)
        assert status == expected, f"Authorization {header!r}: {status} {body!r}"
        if expected == 401:
            error = orjson.loads(body)["error"]
            assert error["code"] == -32001
            assert error["message"] in (MISSING, INVALID), error
        else:
            assert orjson.loads(body)["result"]["singleAgent"] is True


# --- bearer authentication ------------------------------------------------------------------


async def test_auth_with_token_configured(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN="tok"))
    await assert_auth_table(
        http,
        bridge.rpc_url,
        [
            ("tok", 200),  # raw token without a scheme (compatibility)
            ("Bearer tok", 200),
            ("bearer tok", 200),
            ("BEARER tok", 200),
            ("Bearer  tok", 200),  # remainder is trimmed
            (None, 401),
            ("Bearer wrong", 401),
            ("Bearer tokk", 401),
            ("Bearer to", 401),
            ("to", 401),
            ("Basic tok", 401),
            ("Bearer", 401),
            ("Bearertok", 401),
            ("Token tok", 401),
        ],
    )


async def test_a_wrong_token_is_told_apart_from_a_missing_one(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """Issue 15 item 7: 'missing' only when no credential was sent."""
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN="tok"))
    cases = [
        (None, MISSING),
        ("", MISSING),
        ("Bearer", MISSING),
        ("Bearer   ", MISSING),
        ("Bearer wrong", INVALID),
        ("wrong", INVALID),
        ("Basic dG9rOg==", INVALID),
    ]
    for header, message in cases:
        headers = {} if header is None else {"Authorization": header}
        status, _, body = await post_caps(http, bridge.rpc_url, headers)
        assert status == 401
        assert orjson.loads(body)["error"] == {"code": -32001, "message": message}, header
    open_bridge = await start_bridge(env=base_env())  # no token: any bearer, none missing
    for header, message in [(None, MISSING), ("Bearer ", MISSING), ("anything", MISSING)]:
        headers = {} if header is None else {"Authorization": header}
        status, _, body = await post_caps(http, open_bridge.rpc_url, headers)
        assert (status, orjson.loads(body)["error"]["message"]) == (401, message), header


async def test_auth_token_from_env_is_trimmed(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN="  tok  "))
    await assert_auth_table(http, bridge.rpc_url, [("Bearer tok", 200), ("tok", 200)])


async def test_auth_without_token_on_loopback_accepts_any_bearer(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env())
    await assert_auth_table(
        http,
        bridge.rpc_url,
        [
            ("Bearer anything", 200),
            ("bearer x", 200),
            (None, 401),
            ("Basic x", 401),
            ("Bearer", 401),
            ("anything", 401),
        ],
    )


# --- origin allow-list ------------------------------------------------------------------------

DEFAULT_ALLOWED = [
    "http://localhost:5173",
    "http://localhost:3000",
    "http://127.0.0.1:8080",
    "https://xworkmate.svc.plus",
]
DEFAULT_REJECTED = [
    "http://localhost:evil",  # the original's string-prefix rule let this through
    "http://localhost:5173.evil.com",
    "http://localhost.evil.com:5173",
    "http://127.0.0.1.nip.io:80",
    "https://localhost:5173",
    "https://evil.example.com",
    "https://xworkmate.svc.plus.evil.com",
    "http://xworkmate.svc.plus",
    "https://xworkmate.svc.plus:8443",
    "null",
]


async def assert_origins(
    http: aiohttp.ClientSession, url: str, allowed: list[str], rejected: list[str]
) -> None:
    for origin in allowed:
        status, headers, body = await post_caps(http, url, {**AUTH, "Origin": origin})
        assert status == 200, f"{origin}: {status} {body!r}"
        assert headers["Access-Control-Allow-Origin"] == origin
    for origin in rejected:
        status, headers, body = await post_caps(http, url, {**AUTH, "Origin": origin})
        assert status == 403, f"{origin}: {status} {body!r}"
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body) == forbidden(origin)
        assert "Access-Control-Allow-Origin" not in headers


async def test_default_origin_allow_list(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    await assert_origins(http, bridge.rpc_url, DEFAULT_ALLOWED, DEFAULT_REJECTED)
    # no Origin at all (non-browser client) is always allowed
    status, headers, _ = await post_caps(http, bridge.rpc_url, AUTH)
    assert status == 200
    assert "Access-Control-Allow-Origin" not in headers


async def test_allowed_origins_override(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        ACP_ALLOWED_ORIGINS=" https://app.example.com , ,http://dev.example.com:* ",
    )
    bridge = await start_bridge(env=env)
    await assert_origins(
        http,
        bridge.rpc_url,
        allowed=["https://app.example.com", "http://dev.example.com:9000"],
        rejected=[
            "http://localhost:5173",
            "https://xworkmate.svc.plus",
            "http://app.example.com",
            "https://dev.example.com:9000",
            "http://dev.example.com:evil",
        ],
    )


async def test_blank_allowed_origins_means_default(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env(ACP_AUTH_TOKEN=TOKEN, ACP_ALLOWED_ORIGINS="   "))
    await assert_origins(
        http,
        bridge.rpc_url,
        allowed=["http://localhost:5173", "https://xworkmate.svc.plus"],
        rejected=["https://evil.example.com"],
    )


async def test_a_long_refused_origin_is_cut_in_the_answer_as_in_the_log(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """The 403 repeated the whole ``Origin`` (up to 8190 bytes) while the log line kept
    200 characters: the answer keeps the same 200, after the contract's message start."""
    bridge = await start_bridge()
    origin = "https://evil.example/" + "a" * 4000
    status, _, body = await post_caps(http, bridge.rpc_url, {**AUTH, "Origin": origin})
    assert status == 403
    assert orjson.loads(body) == forbidden(origin[:200])
    status, _, body = await get_acp(
        http, bridge.url + "/acp", {**WS_UPGRADE, **AUTH, "Origin": origin}
    )
    assert status == 403
    assert orjson.loads(body) == forbidden(origin[:200])


# --- the same checks on the WebSocket upgrade /acp -------------------------------------------


async def get_acp(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], method: str = "GET"
) -> tuple[int, Any, bytes]:
    async with http.request(method, url, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


async def test_ws_upgrade_rejects_disallowed_origin_before_upgrade(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    url = bridge.url + "/acp"
    for origin in ("https://evil.example.com", "http://localhost:evil"):
        status, headers, body = await get_acp(http, url, {**WS_UPGRADE, **AUTH, "Origin": origin})
        assert status == 403
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body) == forbidden(origin)
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(bridge.ws_url, headers={**AUTH, "Origin": "https://evil.example"})
    assert info.value.status == 403


async def test_ws_upgrade_requires_bearer(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    url = bridge.url + "/acp"
    for auth, message in (({}, MISSING), ({"Authorization": "Bearer wrong"}, INVALID)):
        status, headers, body = await get_acp(
            http, url, {**WS_UPGRADE, **auth, "Origin": "http://localhost:5173"}
        )
        assert status == 401
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body)["error"] == {"code": -32001, "message": message}
        assert "Access-Control-Allow-Origin" not in headers  # /acp never emits CORS
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await http.ws_connect(bridge.ws_url)
    assert info.value.status == 401
    # origin is checked before auth
    status, _, body = await get_acp(http, url, {**WS_UPGRADE, "Origin": "https://evil.example"})
    assert status == 403
    assert orjson.loads(body)["error"]["code"] == -32003


async def test_ws_upgrade_accepts_allowed_origin_and_token(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    async with http.ws_connect(
        bridge.ws_url, headers={**AUTH, "Origin": "http://localhost:5173"}
    ) as ws:
        await ws.send_str('{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}')
        reply = orjson.loads(await ws.receive_str(timeout=5))
        assert reply["id"] == 1
        assert reply["result"]["singleAgent"] is True


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_non_get_on_acp_is_405_text(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str
) -> None:
    bridge = await start_bridge()
    status, headers, body = await get_acp(http, bridge.url + "/acp", AUTH, method=method)
    assert status == 405
    assert headers["Content-Type"].startswith("text/plain")
    assert b"method not allowed" in body


async def test_get_acp_without_upgrade_headers_is_400_text(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, headers, body = await get_acp(http, bridge.url + "/acp", AUTH)
    assert status == 400
    assert headers["Content-Type"].startswith("text/plain")
    assert body.endswith(b"\n") and body.startswith(b"400 ")


# --- bind policy: no non-loopback listener without a token -----------------------------------


def run_serve(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xwm_bridge", "serve", *args],
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "extra_env"),
    [
        (("--listen", "0.0.0.0:0"), {}),
        (("--listen", "0.0.0.0:0"), {"ACP_AUTH_TOKEN": "   "}),
        ((), {"ACP_LISTEN_ADDR": "0.0.0.0:0"}),
    ],
    ids=["flag", "blank-token", "env-listen"],
)
def test_non_loopback_bind_without_token_is_refused(
    args: tuple[str, ...], extra_env: dict[str, str]
) -> None:
    proc = run_serve(*args, env=base_env(**extra_env))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "ACP_AUTH_TOKEN" in lines[0]
    assert "0.0.0.0:0" in lines[0]
    assert "Traceback" not in proc.stderr


async def test_non_loopback_bind_with_allow_unauthenticated_starts(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge("--listen", "0.0.0.0:0", "--allow-unauthenticated", env=base_env())
    listening = [orjson.loads(line) for line in bridge.logs if '"listening"' in line]
    assert listening and listening[0]["host"] == "0.0.0.0"
    status, _, body = await post_caps(http, bridge.rpc_url, {"Authorization": "Bearer any"})
    assert status == 200, body
    status, _, _ = await post_caps(http, bridge.rpc_url, {})
    assert status == 401


async def test_non_loopback_bind_with_token_starts(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge("--listen", "0.0.0.0:0", env=base_env(ACP_AUTH_TOKEN=TOKEN))
    status, _, _ = await post_caps(http, bridge.rpc_url, AUTH)
    assert status == 200
    status, _, body = await post_caps(http, bridge.rpc_url, {"Authorization": "Bearer any"})
    assert status == 401
    assert orjson.loads(body)["error"] == {"code": -32001, "message": INVALID}


@pytest.mark.parametrize(
    ("yaml_text", "key", "args"),
    [
        ("client_tokens: ['']\n", "client_tokens[0]", ()),
        ("client_tokens: ['${XWM_TEST_UNSET_TOKEN:-}']\n", "client_tokens[0]", ()),
        ("client_tokens: ['']\n", "client_tokens[0]", ("--listen", "0.0.0.0:0")),
        ("admin_tokens: [ok, ' ']\n", "admin_tokens[1]", ()),
    ],
    ids=["loopback", "unset-var", "non-loopback", "admin"],
)
def test_blank_client_tokens_are_refused_at_start(
    tmp_path: Any, yaml_text: str, key: str, args: tuple[str, ...]
) -> None:
    """issue 16 item 5: a blank token passed the non-loopback check and, on loopback,
    accepted any bearer. Now it is a config error naming the key."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text)
    proc = run_serve(*args, "--config", str(config), env=base_env())
    assert proc.returncode == 2, proc.stderr
    assert f"{key}: must not be blank" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- secrets in replies (issue 16 item 11) --------------------------------------------------

ECHO_TOKENS = ['svc-"quoted\\back-token', "sv"]  # JSON-escaped forms, and a short token


@pytest.mark.parametrize("service_token", ECHO_TOKENS, ids=["escaped", "short"])
async def test_an_upstream_echoing_authorization_leaks_nothing(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    serve_app: Any,
    tmp_path: Any,
    service_token: str,
) -> None:
    """The upstream puts the request's Authorization header in its error body and in
    a notification: the client sees [REDACTED] on every transport, and so do the logs."""
    from aiohttp import web

    from tests.conftest import providers_config, session_params, sse

    async def handle(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        echoed = request.headers.get("Authorization", "")
        prompt = body["params"]["taskPrompt"]
        if prompt == "status":
            return web.Response(status=500, text=f"denied: Authorization: {echoed}")
        if prompt == "rpc-error":
            error = {"code": -32000, "message": f"bad credential {echoed}"}
            return web.json_response({"jsonrpc": "2.0", "id": body["id"], "error": error})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        note = {"jsonrpc": "2.0", "method": "session.update", "params": {"echo": echoed}}
        done = {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True, "output": echoed}}
        for message in (note, done):
            await resp.write(b"data: " + orjson.dumps(message) + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    url = await serve_app(app)
    env = base_env(ACP_AUTH_TOKEN=TOKEN, INTERNAL_SERVICE_TOKEN=service_token)
    config = providers_config({"id": "codex", "endpoint": url, "stream": False})
    bridge = await start_bridge(env=env, config=config, tmp=tmp_path)
    escaped = orjson.dumps(service_token)[1:-1].decode()

    def clean(data: str) -> None:
        if len(service_token) > 3:
            assert service_token not in data and escaped not in data
        else:  # a short token: no value may hold it (keys may: "jsonrpc", "sessionId", …)
            for value in _strings(orjson.loads(data)):
                assert service_token not in value.replace("[REDACTED]", "\0")

    for prompt in ("status", "rpc-error"):
        body = orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "session.start",
             "params": session_params(f"leak-{prompt}", prompt)}
        )  # fmt: skip
        async with http.post(bridge.rpc_url, data=body, headers=AUTH) as resp:
            raw = await resp.text()
        clean(raw)
        assert "[REDACTED]" in raw
    first_logs = list(bridge.logs)
    await bridge.stop()  # one daemon per state directory
    streaming = providers_config({"id": "codex", "endpoint": url})
    bridge2 = await start_bridge(env=env, config=streaming, tmp=tmp_path)
    events = await sse(http, bridge2.rpc_url, "session.start", session_params("leak-sse", "ok"))
    for event in events:
        clean(orjson.dumps(event).decode())
    assert events[-1]["result"]["output"] == "Bearer [REDACTED]"
    async with http.ws_connect(bridge2.ws_url, headers=AUTH) as ws:
        await ws.send_str(
            orjson.dumps(
                {"jsonrpc": "2.0", "id": 3, "method": "session.message",
                 "params": session_params("leak-sse", "ok")}
            ).decode()
        )  # fmt: skip
        while True:
            raw = (await ws.receive(timeout=10)).data
            clean(raw)
            if orjson.loads(raw).get("id") == 3:
                break
    replay = orjson.dumps(
        {"jsonrpc": "2.0", "id": 4, "method": "session.replay", "params": {"sessionId": "leak-sse"}}
    )
    async with http.post(bridge2.rpc_url, data=replay, headers=AUTH) as resp:
        clean(await resp.text())
    for line in first_logs + bridge2.logs:
        clean(line)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


# --- sessions belong to a principal (issue 16 item 8) ----------------------------------------

TOKEN_A, TOKEN_B, TOKEN_ADMIN = "client-token-aaaa", "client-token-bbbb", "admin-token-cccc"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def call(
    http: aiohttp.ClientSession, url: str, token: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    async with http.post(url, data=body, headers=bearer(token)) as resp:
        assert resp.status == 200, await resp.text()
        reply: dict[str, Any] = orjson.loads(await resp.read())
        return reply


async def catch_up(http: aiohttp.ClientSession, url: str, token: str) -> tuple[int, bytes]:
    async with http.get(url, headers=bearer(token)) as resp:
        return resp.status, await resp.read()


async def test_sessions_belong_to_the_token_that_made_them(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: Any, tmp_path: Any
) -> None:
    from tests.conftest import provider_env, session_params

    env = provider_env(fake_upstream.url, XWM_ADMIN_TOKENS=TOKEN_ADMIN)
    config = {"client_tokens": [TOKEN_A, TOKEN_B], "store": {"state_dir": str(tmp_path)}}
    bridge = await start_bridge(env=env, config=config, tmp=tmp_path)
    url = bridge.rpc_url
    events = f"{bridge.url}/acp/sessions/owned/events"
    started = await call(http, url, TOKEN_A, "session.start", session_params("owned", "hi"))
    assert started["result"]["success"] is True

    async def refused_to(token: str) -> None:
        for method, params in [
            ("session.replay", {"sessionId": "owned"}),
            ("session.message", session_params("owned", "mine now")),
            ("session.start", session_params("owned", "reset it")),
            ("session.cancel", {"sessionId": "owned"}),
            ("session.close", {"sessionId": "owned"}),
        ]:
            reply = await call(http, url, token, method, params)
            assert reply["error"] == {
                "code": -32003,
                "message": "session belongs to another client",
            }, method
        status, body = await catch_up(http, events, token)
        assert status == 403 and orjson.loads(body)["error"]["code"] == -32003

    await refused_to(TOKEN_B)
    # the owner still has it, untouched by B's attempts
    replay = await call(http, url, TOKEN_A, "session.replay", {"sessionId": "owned"})
    assert replay["result"]["found"] is True and replay["result"]["notifications"]
    assert (await catch_up(http, events, TOKEN_A))[0] == 200
    more = await call(http, url, TOKEN_A, "session.message", session_params("owned", "again"))
    assert more["result"]["success"] is True
    # an admin token sees (and may act on) every session
    admin = await call(http, url, TOKEN_ADMIN, "session.replay", {"sessionId": "owned"})
    assert admin["result"]["found"] is True
    assert (await catch_up(http, events, TOKEN_ADMIN))[0] == 200
    # B's own sessions are B's
    mine = await call(http, url, TOKEN_B, "session.start", session_params("b-own", "hi"))
    assert mine["result"]["success"] is True
    assert "error" in await call(http, url, TOKEN_A, "session.replay", {"sessionId": "b-own"})

    # the owner is stored: after a restart B is still refused
    await bridge.stop()
    again = await start_bridge(env=env, config=config, tmp=tmp_path)
    url, events = again.rpc_url, f"{again.url}/acp/sessions/owned/events"
    await refused_to(TOKEN_B)
    replay = await call(http, url, TOKEN_A, "session.replay", {"sessionId": "owned"})
    assert replay["result"]["found"] is True
    closed = await call(http, url, TOKEN_A, "session.close", {"sessionId": "owned"})
    assert closed["result"]["accepted"] is True


async def test_operator_methods_show_a_client_only_its_own_sessions(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: Any, tmp_path: Any
) -> None:
    """The console's methods (issue 13) under issue 16: with several client tokens, a
    client lists and reads only its own sessions and gets no bridge-wide feed; an admin
    token sees everything."""
    from tests.conftest import provider_env, session_params

    env = provider_env(fake_upstream.url, XWM_ADMIN_TOKENS=TOKEN_ADMIN)
    bridge = await start_bridge(env=env, config={"client_tokens": [TOKEN_A, TOKEN_B]}, tmp=tmp_path)
    url = bridge.rpc_url
    await call(http, url, TOKEN_A, "session.start", session_params("a-1", "hi"))
    await call(http, url, TOKEN_B, "session.start", session_params("b-1", "hi"))

    async def listed(token: str) -> set[str]:
        reply = await call(http, url, token, "session.list", {})
        return {s["sessionId"] for s in reply["result"]["sessions"]}

    assert await listed(TOKEN_A) == {"a-1"}
    assert await listed(TOKEN_B) == {"b-1"}
    assert await listed(TOKEN_ADMIN) == {"a-1", "b-1"}
    assert (await call(http, url, TOKEN_A, "session.get", {"sessionId": "a-1"}))["result"]
    other = await call(http, url, TOKEN_A, "session.get", {"sessionId": "b-1"})
    assert other["error"]["code"] == -32003
    admin_view = await call(http, url, TOKEN_ADMIN, "session.get", {"sessionId": "b-1"})
    assert admin_view["result"]["session"]["sessionId"] == "b-1"
    for method in ("bridge.watch", "bridge.health", "bridge.config"):
        refused = await call(http, url, TOKEN_B, method, {"waitMs": 0})
        assert refused["error"]["code"] == -32003, method
        allowed = await call(http, url, TOKEN_ADMIN, method, {"waitMs": 0})
        assert "result" in allowed, (method, allowed)


async def test_a_start_queued_behind_the_owners_first_turn_is_refused(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: Any, tmp_path: Any
) -> None:
    """Two clients start the same brand-new session at once: both pass the arrival check
    (no owner yet), and the second turn is refused at the head of the queue, before its
    reset (it used to wipe the first one's session and take it)."""
    import asyncio

    from tests.conftest import provider_env, session_params

    env = provider_env(fake_upstream.url)
    bridge = await start_bridge(env=env, config={"client_tokens": [TOKEN_A, TOKEN_B]}, tmp=tmp_path)
    url = bridge.rpc_url
    a, b = await asyncio.gather(  # neither sees an owner when it arrives
        call(http, url, TOKEN_A, "session.start", session_params("race", "slow:300 a")),
        call(http, url, TOKEN_B, "session.start", session_params("race", "slow:300 b")),
    )
    outcomes = sorted("error" in r for r in (a, b))
    assert outcomes == [False, True], (a, b)  # one ran; the other was refused at its turn
    loser = a if "error" in a else b
    assert loser["error"]["code"] == -32003
    winner = TOKEN_A if loser is b else TOKEN_B
    other = TOKEN_B if winner == TOKEN_A else TOKEN_A
    replay = await call(http, url, winner, "session.replay", {"sessionId": "race"})
    assert replay["result"]["found"] is True and replay["result"]["lastTurnStatus"] == "completed"
    refused = await call(http, url, other, "session.replay", {"sessionId": "race"})
    assert refused["error"]["code"] == -32003
