"""HTTP routes and the ``POST /acp/rpc`` processing order (contract.md §2, §4, §5, §8, §10;
examples.md §1, §2, §9, §16), against the real daemon on a loopback port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    FakeUpstream,
    StartBridge,
    base_env,
    provider_env,
    rpc,
    session_params,
)
from xwm_bridge import __version__

IMAGE = "ghcr.io/x-evor/xworkmate-bridge:0123456789abcdef0123456789abcdef01234567"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ALLOWED_ORIGIN = "http://localhost:5173"
CATALOG = [
    {"providerId": "codex", "label": "Codex"},
    {"providerId": "opencode", "label": "OpenCode"},
    {"providerId": "gemini", "label": "Gemini"},
]
PLAIN = "text/plain; charset=utf-8"


async def request(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, bytes]:
    async with http.request(method, url, data=body, headers=headers) as resp:
        return resp.status, resp.headers, await resp.read()


def envelope_error(code: int, message: str, rid: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


# --- plain routes -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH"])
async def test_root_answers_any_method_without_auth(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str
) -> None:
    bridge = await start_bridge()
    status, headers, body = await request(http, method, bridge.url + "/")
    assert status == 200
    assert headers["Content-Type"] == PLAIN
    assert body == b"xworkmate-bridge is running"


async def test_root_ignores_query_string(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, _, body = await request(http, "GET", bridge.url + "/?probe=1")
    assert (status, body) == (200, b"xworkmate-bridge is running")


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
async def test_ping_reports_image_fields_for_any_method(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str
) -> None:
    bridge = await start_bridge(env=base_env(IMAGE=IMAGE))
    status, headers, body = await request(http, method, bridge.url + "/api/ping")
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(body) == {
        "commit": COMMIT,
        "image": IMAGE,
        "status": "ok",
        "tag": COMMIT,
        "version": COMMIT,
        "packageVersion": __version__,  # additive (issue 15): this build's version
    }


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("", {"image": "", "tag": "", "commit": "", "version": ""}),
        (
            "ghcr.io/x-evor/xworkmate-bridge:main-2026-04-12",
            {
                "image": "ghcr.io/x-evor/xworkmate-bridge:main-2026-04-12",
                "tag": "main-2026-04-12",
                "commit": "",
                "version": "main-2026-04-12",
            },
        ),
        (
            "registry:5000/app@sha256:abc",
            {
                "image": "registry:5000/app@sha256:abc",
                "tag": "registry:5000/app",
                "commit": "",
                "version": "registry:5000/app",
            },
        ),
    ],
)
async def test_ping_image_reference_variants(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    image: str,
    expected: dict[str, str],
) -> None:
    env = base_env(IMAGE=image) if image else base_env()
    bridge = await start_bridge(env=env)
    status, _, body = await request(http, "GET", bridge.url + "/api/ping")
    assert status == 200
    assert orjson.loads(body) == {"status": "ok", **expected, "packageVersion": __version__}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/nope"),
        ("POST", "/acp/rpc/"),
        ("GET", "/api/ping/"),
        ("GET", "/acp/"),
        ("POST", "/ACP/RPC"),
        ("GET", "/bridge/bootstrap/health/"),
        ("GET", "//"),
    ],
)
async def test_unknown_paths_are_404_without_trailing_slash_tolerance(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str, path: str
) -> None:
    bridge = await start_bridge()
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
    status, headers, raw = await request(http, method, bridge.url + path, body, AUTH)
    assert status == 404
    assert headers["Content-Type"].startswith("text/plain")
    assert raw == b"404 page not found\n"


# --- /acp/rpc transport errors (examples.md §16) ------------------------------------------


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_rpc_non_post_is_405_json(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str
) -> None:
    bridge = await start_bridge()
    status, headers, body = await request(http, method, bridge.rpc_url, headers=AUTH)
    assert status == 405
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(body) == envelope_error(-32600, "method not allowed")


async def test_rpc_method_check_precedes_auth(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, _, body = await request(http, "GET", bridge.rpc_url)
    assert status == 405
    assert orjson.loads(body) == envelope_error(-32600, "method not allowed")


async def test_options_preflight_allowed_origin_has_exact_cors_headers(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    headers = {"Origin": ALLOWED_ORIGIN, "Access-Control-Request-Method": "POST"}
    status, resp_headers, body = await request(http, "OPTIONS", bridge.rpc_url, headers=headers)
    assert status == 204
    assert body == b""
    assert resp_headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
    assert resp_headers["Access-Control-Allow-Methods"] == "POST, OPTIONS"
    assert resp_headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type, Accept"
    assert resp_headers["Access-Control-Max-Age"] == "600"
    assert resp_headers.getall("Vary") == [
        "Origin",
        "Access-Control-Request-Method",
        "Access-Control-Request-Headers",
    ]
    assert "Access-Control-Allow-Credentials" not in resp_headers


@pytest.mark.parametrize("origin", [None, "https://evil.example.com", "http://localhost:evil"])
async def test_options_without_allowed_origin_is_204_without_cors(
    start_bridge: StartBridge, http: aiohttp.ClientSession, origin: str | None
) -> None:
    bridge = await start_bridge()
    headers = {"Access-Control-Request-Method": "POST"}
    if origin is not None:
        headers["Origin"] = origin
    status, resp_headers, body = await request(http, "OPTIONS", bridge.rpc_url, headers=headers)
    assert status == 204
    assert body == b""
    assert not [h for h in resp_headers if h.lower().startswith("access-control-")]
    assert "Vary" not in resp_headers


async def test_post_with_disallowed_origin_is_403(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
    headers = {**AUTH, "Origin": "https://evil.example.com"}
    status, resp_headers, raw = await request(http, "POST", bridge.rpc_url, body, headers)
    assert status == 403
    assert resp_headers["Content-Type"].startswith("application/json")
    assert orjson.loads(raw) == envelope_error(
        -32003, "origin not allowed: https://evil.example.com"
    )
    assert "Access-Control-Allow-Origin" not in resp_headers


async def test_origin_check_precedes_auth(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
    status, _, raw = await request(
        http, "POST", bridge.rpc_url, body, {"Origin": "https://evil.example.com"}
    )
    assert status == 403
    assert orjson.loads(raw)["error"]["code"] == -32003


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        # contract.md §3.3: the same message whether the header was missing or wrong
        # (clients of the original match on it); the log's and metric's reason differ
        ({}, "missing bearer authorization"),
        ({"Authorization": "Bearer wrong-token"}, "missing bearer authorization"),
        ({"Authorization": "Basic dXNlcjpwdw=="}, "missing bearer authorization"),
    ],
    ids=["missing", "wrong", "basic"],
)
async def test_post_without_valid_bearer_is_401(
    start_bridge: StartBridge, http: aiohttp.ClientSession, headers: dict[str, str], message: str
) -> None:
    bridge = await start_bridge()
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
    status, resp_headers, raw = await request(http, "POST", bridge.rpc_url, body, headers)
    assert status == 401
    assert resp_headers["Content-Type"].startswith("application/json")
    assert orjson.loads(raw) == envelope_error(-32001, message)


async def test_missing_method_is_400(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    for body in (
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":1,"method":null}',
        b'{"jsonrpc":"2.0","id":1,"method":"   "}',
    ):
        status, headers, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
        assert status == 400, body
        assert headers["Content-Type"].startswith("application/json")
        assert orjson.loads(raw) == envelope_error(-32700, "missing method"), body


async def test_undecodable_requests_are_400_invalid_json(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    for body in (
        b"{oops",
        b"",
        b'[{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}]',
        b'"acp.capabilities"',
        b'{"jsonrpc":"2.0","id":1,"method":5}',
        b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities","params":[1]}',
        b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities","params":"x"}',
    ):
        status, headers, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
        assert status == 400, body
        assert headers["Content-Type"].startswith("application/json")
        reply = orjson.loads(raw)
        assert set(reply) == {"jsonrpc", "id", "error"}, body
        assert reply["jsonrpc"] == "2.0"
        assert reply["id"] is None
        assert set(reply["error"]) == {"code", "message"}
        assert reply["error"]["code"] == -32700, body
        assert reply["error"]["message"].startswith("invalid json: "), reply


async def test_unknown_method_is_200_json_error(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    body = b'{"jsonrpc":"2.0","id":9,"method":"xworkmate.providers.sync"}'
    status, headers, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
    assert status == 200
    assert headers["Content-Type"].startswith("application/json")
    assert orjson.loads(raw) == envelope_error(
        -32601, "unknown method: xworkmate.providers.sync", 9
    )


async def test_rpc_ignores_query_string(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    body = b'{"jsonrpc":"2.0","id":3,"method":"acp.capabilities"}'
    status, _, raw = await request(http, "POST", bridge.rpc_url + "?trace=1", body, AUTH)
    assert status == 200
    assert orjson.loads(raw)["id"] == 3


async def test_method_name_is_trimmed_and_ids_echo_their_type(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    for rid in ("cap-1", 7, 2.5, 0, ""):
        body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "  acp.capabilities "})
        status, _, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
        assert status == 200
        reply = orjson.loads(raw)
        assert reply["id"] == rid and type(reply["id"]) is type(rid), reply
        assert reply["result"]["singleAgent"] is True


async def test_notification_in_plain_mode_runs_then_answers_empty(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    for rid_member in ({}, {"id": None}):
        body = orjson.dumps({"jsonrpc": "2.0", "method": "acp.capabilities", **rid_member})
        status, _, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
        assert (status, raw) == (200, b"")
    # A session turn sent as a notification is executed completely before the reply.
    body = orjson.dumps(
        {"jsonrpc": "2.0", "method": "session.start", "params": session_params("n1", "x")}
    )
    status, _, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
    assert (status, raw) == (200, b"")
    assert fake_upstream.state.completed == 1
    assert [r["method"] for r in fake_upstream.state.requests] == ["session.start"]


@pytest.mark.parametrize(
    "method", ["session.start", "session.message", "session.cancel", "session.close"]
)
async def test_session_methods_require_session_id(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str
) -> None:
    bridge = await start_bridge()
    for params in (
        {"taskPrompt": "hi"},
        {"sessionId": "   ", "taskPrompt": "hi"},
        {"sessionId": "", "routing": {"routingMode": "auto"}},
    ):
        reply = await rpc(http, bridge.rpc_url, method, params, rid="e1")
        assert reply == envelope_error(-32602, "sessionId is required", "e1"), params


@pytest.mark.parametrize("method", ["session.start", "session.message"])
async def test_session_turn_without_routing_is_routing_required(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    method: str,
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    for extra in ({}, {"routing": {}}, {"routing": "codex"}, {"routing": None}):
        params = {"sessionId": "s1", "taskPrompt": "hi", **extra}
        async with http.post(
            bridge.rpc_url,
            data=orjson.dumps({"jsonrpc": "2.0", "id": "e2", "method": method, "params": params}),
            headers=AUTH,
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/json")
            reply = orjson.loads(await resp.read())
        assert reply == envelope_error(-32602, "ROUTING_REQUIRED", "e2"), extra
    assert fake_upstream.state.requests == []


async def test_body_over_limit_is_413_json(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bridge = await start_bridge(config={"limits": {"max_body_bytes": 1024}}, tmp=tmp_path)
    padding = "x" * 2000
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities", "params": {"pad": padding}}
    )
    status, headers, raw = await request(http, "POST", bridge.rpc_url, body, AUTH)
    assert status == 413
    assert headers["Content-Type"].startswith("application/json")
    reply = orjson.loads(raw)
    assert reply["jsonrpc"] == "2.0"
    assert reply["id"] is None
    assert reply["error"]["code"] == -32600
    assert "1024" in reply["error"]["message"]

    # A chunked body (no Content-Length) is cut off at the limit as well.
    async def chunks() -> Any:
        for _ in range(4):
            yield b" " * 600
        yield body

    async with http.post(bridge.rpc_url, data=chunks(), headers=AUTH) as resp:
        assert resp.status == 413
        assert orjson.loads(await resp.read())["error"]["code"] == -32600
    # Just under the limit is served normally.
    small = orjson.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "acp.capabilities", "params": {"pad": "x" * 900}}
    )
    assert len(small) <= 1024
    status, _, raw = await request(http, "POST", bridge.rpc_url, small, AUTH)
    assert status == 200
    assert orjson.loads(raw)["id"] == 2


async def test_cors_headers_on_post_responses_for_allowed_origin(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
    # success, auth failure and decode failure all carry the CORS headers (applied first)
    cases = [
        ({**AUTH, "Origin": ALLOWED_ORIGIN}, body, 200),
        ({"Origin": ALLOWED_ORIGIN}, body, 401),
        ({**AUTH, "Origin": ALLOWED_ORIGIN}, b"{oops", 400),
    ]
    for headers, payload, expected in cases:
        status, resp_headers, _ = await request(http, "POST", bridge.rpc_url, payload, headers)
        assert status == expected
        assert resp_headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
        assert resp_headers["Access-Control-Allow-Methods"] == "POST, OPTIONS"
        assert resp_headers["Access-Control-Allow-Headers"] == (
            "Authorization, Content-Type, Accept"
        )
        assert resp_headers["Access-Control-Max-Age"] == "600"
        assert resp_headers.getall("Vary") == [
            "Origin",
            "Access-Control-Request-Method",
            "Access-Control-Request-Headers",
        ]
    # no Origin → no CORS headers
    status, resp_headers, _ = await request(http, "POST", bridge.rpc_url, body, AUTH)
    assert status == 200
    assert "Access-Control-Allow-Origin" not in resp_headers
    assert "Vary" not in resp_headers


GATEWAYS = [
    {"providerId": "local", "label": "Local"},
    {"providerId": "openclaw", "label": "OpenClaw"},
]


async def test_capabilities_shape(start_bridge: StartBridge, http: aiohttp.ClientSession) -> None:
    bridge = await start_bridge()
    reply = await rpc(http, bridge.rpc_url, "acp.capabilities", rid="cap-1")
    # additive: the known local agents and why they are not providers (detection is off)
    local = reply["result"].pop("localAgents")
    assert [a["id"] for a in local] == ["opencode", "gemini", "codex", "claude", "qwen", "goose"]
    assert {a["reason"] for a in local} == {"detection off (agents.detect)"}
    # every backend of this build is advertised (contract.md §11.1 values)
    assert reply == {
        "jsonrpc": "2.0",
        "id": "cap-1",
        "result": {
            "singleAgent": True,
            "multiAgent": True,
            "providerCatalog": CATALOG,
            "gatewayProviders": GATEWAYS,
            "capabilities": {
                "single_agent": True,
                "multi_agent": True,
                "providerCatalog": CATALOG,
                "gatewayProviders": GATEWAYS,
            },
            # additive (issue 13): the operator methods and the watch notification
            "operator": {
                "methods": [
                    "session.list",
                    "session.get",
                    "permission.list",
                    "bridge.watch",
                    "bridge.health",
                    "bridge.config",
                ],
                "watchNotification": "bridge.event",
            },
        },
    }


async def test_capabilities_ignores_params(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    plain = await rpc(http, bridge.rpc_url, "acp.capabilities")
    with_params = await rpc(http, bridge.rpc_url, "acp.capabilities", {"anything": [1, 2]})
    assert plain == with_params


async def test_catch_up_refusals_carry_the_cors_headers(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """A browser client reads why its catch-up was refused (400 bad cursor, 403 another
    client's session), not an opaque CORS failure."""
    other = {"Authorization": "Bearer other-client-token-77", "Origin": ALLOWED_ORIGIN}
    bridge = await start_bridge(
        env=provider_env(fake_upstream.url, XWM_CLIENT_TOKENS="other-client-token-77")
    )
    await rpc(http, bridge.rpc_url, "session.start", session_params("mine", "hi"))
    cases = [
        ({**AUTH, "Origin": ALLOWED_ORIGIN}, "/acp/sessions/mine/events?afterSeq=x", 400),
        (other, "/acp/sessions/mine/events", 403),
    ]
    for headers, path, expected in cases:
        status, resp_headers, body = await request(http, "GET", bridge.url + path, None, headers)
        assert status == expected, body
        assert resp_headers["Access-Control-Allow-Origin"] == ALLOWED_ORIGIN
        assert resp_headers["Vary"].startswith("Origin")
        assert orjson.loads(body)["error"]["message"]
