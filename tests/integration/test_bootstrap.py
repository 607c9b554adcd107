"""Pairing endpoints ``/bridge/bootstrap/*`` (adapters.md §5; examples.md §21), with an
in-process fake accounts service."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import StartBridge, base_env, log_entries

PUBLIC = "https://xworkmate-bridge.svc.plus"
SERVICE_TOKEN = "svc-token-0123456789"
CONSUME_PATH = "/api/internal/xworkmate/bridge/bootstrap/consume"
ACCOUNTS_ANSWER = {
    "ticketId": "ticket-1",
    "targetBridge": PUBLIC,
    "BRIDGE_SERVER_URL": PUBLIC,
    "authMode": "shared-token",
    "BRIDGE_AUTH_TOKEN": "shared-token-value",
    "expiresAt": "2026-04-10T00:00:00Z",
    "scopes": ["connect", "pairing.bootstrap"],
}
EXPECTED_SETUP_CODE = (
    '{"BRIDGE_AUTH_TOKEN":"shared-token-value","BRIDGE_SERVER_URL":"https://xworkmate-bridge.svc.plus",'
    '"authMode":"shared-token","bridgeOrigin":"https://xworkmate-bridge.svc.plus",'
    '"expiresAt":"2026-04-10T00:00:00Z","issuedBy":"xworkmate-bridge",'
    '"token":"shared-token-value","url":"https://xworkmate-bridge.svc.plus"}'
)


@dataclass
class FakeAccounts:
    server: TestServer
    seen: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    body: bytes = orjson.dumps(ACCOUNTS_ANSWER)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"


@pytest.fixture
async def accounts() -> AsyncIterator[FakeAccounts]:
    holder: list[FakeAccounts] = []

    async def consume(request: web.Request) -> web.Response:
        fake = holder[0]
        fake.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "headers": dict(request.headers),
                "body": await request.read(),
            }
        )
        return web.Response(
            status=fake.status,
            body=fake.body,
            content_type="application/json",
            headers=fake.headers,
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", consume)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    holder.append(FakeAccounts(server))
    try:
        yield holder[0]
    finally:
        await server.close()


def bootstrap_env(accounts_url: str | None = None, **extra: str) -> dict[str, str]:
    env: dict[str, str] = {"BRIDGE_PUBLIC_BASE_URL": PUBLIC, **extra}
    if accounts_url is not None:
        env["ACCOUNTS_BASE_URL"] = accounts_url
    env.setdefault("INTERNAL_SERVICE_TOKEN", SERVICE_TOKEN)
    if env["INTERNAL_SERVICE_TOKEN"] == "":
        del env["INTERNAL_SERVICE_TOKEN"]
    return base_env(**env)


async def consume(
    http: aiohttp.ClientSession, url: str, body: Any, raw: bytes | None = None
) -> tuple[int, Any, bytes]:
    data = raw if raw is not None else orjson.dumps(body)
    async with http.post(
        url + "/bridge/bootstrap/consume",
        data=data,
        headers={"Content-Type": "application/json"},
    ) as resp:
        return resp.status, resp.headers, await resp.read()


def assert_text(status: int, headers: Any, body: bytes, exp_status: int, message: str) -> None:
    assert status == exp_status, body
    assert headers["Content-Type"].startswith("text/plain")
    assert body == message.encode() + b"\n"


# --- health --------------------------------------------------------------------------------


async def test_health_reports_public_base_url(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env(BRIDGE_PUBLIC_BASE_URL=" https://b.example.test/ "))
    async with http.get(bridge.url + "/bridge/bootstrap/health") as resp:  # no auth needed
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/json")
        assert orjson.loads(await resp.read()) == {
            "bridgeOrigin": "https://b.example.test",
            "issuedBy": "xworkmate-bridge",
            "ok": True,
        }


async def test_health_default_public_base_url(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=base_env())
    async with http.get(bridge.url + "/bridge/bootstrap/health") as resp:
        assert orjson.loads(await resp.read()) == {
            "bridgeOrigin": PUBLIC,
            "issuedBy": "xworkmate-bridge",
            "ok": True,
        }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/bridge/bootstrap/health"),
        ("DELETE", "/bridge/bootstrap/health"),
        ("GET", "/bridge/bootstrap/consume"),
        ("PUT", "/bridge/bootstrap/consume"),
    ],
)
async def test_wrong_method_is_405_text(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str, path: str
) -> None:
    bridge = await start_bridge(env=base_env())
    async with http.request(method, bridge.url + path) as resp:
        assert_text(resp.status, resp.headers, await resp.read(), 405, "method not allowed")


# --- consume -------------------------------------------------------------------------------


async def test_consume_exchanges_ticket_with_accounts(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    bridge = await start_bridge(env=bootstrap_env(accounts.url + "/"))
    status, headers, body = await consume(
        http, bridge.url, {"ticket": " ticket-1 ", "bridge": PUBLIC, "extra": "ignored"}
    )
    assert status == 200, body
    assert headers["Content-Type"].startswith("application/json")
    answer = orjson.loads(body)
    assert answer == {
        "setupCode": EXPECTED_SETUP_CODE,
        "bridgeOrigin": PUBLIC,
        "authMode": "shared-token",
        "expiresAt": "2026-04-10T00:00:00Z",
        "issuedBy": "xworkmate-bridge",
        "scopes": ["connect", "pairing.bootstrap"],
    }
    assert isinstance(answer["setupCode"], str)

    assert len(accounts.seen) == 1
    call = accounts.seen[0]
    assert call["method"] == "POST"
    assert call["path"] == CONSUME_PATH
    assert call["headers"]["X-Service-Token"] == SERVICE_TOKEN
    assert call["headers"]["Content-Type"].startswith("application/json")
    assert "Authorization" not in call["headers"]
    assert orjson.loads(call["body"]) == {"ticket": "ticket-1", "bridge": PUBLIC}


async def test_consume_blank_bridge_defaults_to_public_url(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    accounts.body = orjson.dumps({k: v for k, v in ACCOUNTS_ANSWER.items() if k != "scopes"})
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    for body in ({"ticket": "t-2"}, {"ticket": "t-3", "bridge": "  "}):
        status, _, raw = await consume(http, bridge.url, body)
        assert status == 200, raw
        answer = orjson.loads(raw)
        assert answer["bridgeOrigin"] == PUBLIC
        assert answer["scopes"] is None  # accounts sent none
    assert [orjson.loads(c["body"]) for c in accounts.seen] == [
        {"ticket": "t-2", "bridge": PUBLIC},
        {"ticket": "t-3", "bridge": PUBLIC},
    ]


async def test_consume_requires_ticket(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    for body in ({"ticket": "   ", "bridge": PUBLIC}, {"bridge": PUBLIC}, {}):
        status, headers, raw = await consume(http, bridge.url, body)
        assert_text(status, headers, raw, 400, "ticket is required")
    assert accounts.seen == []


async def test_consume_rejects_malformed_body(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    for raw_body in (b"{oops", b"[1]", b'{"ticket":5}', b'{"ticket":"t","bridge":[]}'):
        status, headers, raw = await consume(http, bridge.url, None, raw=raw_body)
        assert_text(status, headers, raw, 400, "invalid request body")
    assert accounts.seen == []


async def test_consume_rejects_foreign_bridge(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    for other in ("https://evil.example.com", "https://xworkmate-bridge.svc.plus.evil.com"):
        status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": other})
        # 403, the status the accounts service gives a ticket for another bridge (the
        # original relayed it and passed that status through); never relayed here
        assert_text(status, headers, raw, 403, "bridge does not match this bridge's public URL")
    assert accounts.seen == []  # never relayed


async def test_consume_without_service_token_is_500(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    bridge = await start_bridge(env=bootstrap_env(accounts.url, INTERNAL_SERVICE_TOKEN=""))
    status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": PUBLIC})
    assert_text(status, headers, raw, 500, "internal service token is not configured")
    assert accounts.seen == []


@pytest.mark.parametrize("accounts_status", [400, 401, 403, 404, 409, 410, 429, 500, 503])
async def test_consume_passes_accounts_error_status(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    accounts: FakeAccounts,
    accounts_status: int,
) -> None:
    accounts.status = accounts_status
    accounts.body = b'{"error":"nope"}'
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": PUBLIC})
    assert_text(status, headers, raw, accounts_status, "accounts bootstrap consume failed")
    assert len(accounts.seen) == 1


async def test_consume_does_not_follow_an_accounts_redirect(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    """The service token goes to ACCOUNTS_BASE_URL only: a redirect from there is not
    followed (it was, with X-Service-Token, to any host the Location named)."""
    elsewhere: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        elsewhere.append(dict(request.headers))
        return web.json_response(ACCOUNTS_ANSWER)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    other = TestServer(app, host="127.0.0.1", port=0)
    await other.start_server()
    try:
        accounts.status = 307
        accounts.headers = {"Location": f"http://127.0.0.1:{other.port}{CONSUME_PATH}"}
        bridge = await start_bridge(env=bootstrap_env(accounts.url))
        status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": PUBLIC})
    finally:
        await other.close()
    assert_text(status, headers, raw, 307, "accounts bootstrap consume failed")
    assert "Location" not in headers
    assert len(accounts.seen) == 1 and elsewhere == []


async def test_consume_undecodable_accounts_answer_is_502(
    start_bridge: StartBridge, http: aiohttp.ClientSession, accounts: FakeAccounts
) -> None:
    accounts.body = b"<html>not json"
    bridge = await start_bridge(env=bootstrap_env(accounts.url))
    status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": PUBLIC})
    assert_text(status, headers, raw, 502, "failed to decode accounts bootstrap response")


async def test_consume_unreachable_accounts_is_502(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: connection refused
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    bridge = await start_bridge(env=bootstrap_env(dead))
    status, headers, raw = await consume(http, bridge.url, {"ticket": "t", "bridge": PUBLIC})
    assert_text(status, headers, raw, 502, "failed to contact accounts service")


async def test_consume_is_rate_limited_per_client(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    accounts: FakeAccounts,
    tmp_path: Path,
) -> None:
    bridge = await start_bridge(
        env=bootstrap_env(accounts.url),
        config={"limits": {"bootstrap_requests_per_minute": 3}},
        tmp=tmp_path,
    )
    statuses = []
    for i in range(4):
        status, headers, raw = await consume(
            http, bridge.url, {"ticket": f"t-{i}", "bridge": PUBLIC}
        )
        statuses.append(status)
    assert statuses == [200, 200, 200, 429]
    assert headers["Content-Type"].startswith("text/plain")
    assert raw.endswith(b"\n")
    assert len(accounts.seen) == 3  # the limited request never reached accounts
    # health is not rate-limited
    async with http.get(bridge.url + "/bridge/bootstrap/health") as resp:
        assert resp.status == 200


@pytest.mark.parametrize(
    ("case", "reason", "answered"),
    [
        ("unreachable", "transport", 502),
        ("status", "http_status", 503),
        ("undecodable", "protocol", 502),
        ("no_token", "not_configured", 500),
    ],
)
async def test_a_failed_consume_is_logged_and_counted(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    accounts: FakeAccounts,
    case: str,
    reason: str,
    answered: int,
) -> None:
    """A pairing that fails on the bridge's side (accounts down, refusing, answering
    garbage; no service token) has a warning and a count: a 3 a.m. outage shows."""
    url, extra = accounts.url, {}
    if case == "unreachable":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    elif case == "status":
        accounts.status, accounts.body = 503, b'{"error":"down"}'
    elif case == "undecodable":
        accounts.body = b"<html>not json"
    else:
        extra = {"INTERNAL_SERVICE_TOKEN": ""}
    bridge = await start_bridge(env=bootstrap_env(url, **extra))
    status, _, _ = await consume(http, bridge.url, {"ticket": "ticket-secret-42", "bridge": PUBLIC})
    assert status == answered
    async with http.get(bridge.url + "/metrics") as resp:
        samples = (await resp.text()).splitlines()
    assert f'xwm_bootstrap_failures_total{{reason="{reason}"}} 1.0' in samples
    failed = [e for e in log_entries(bridge.logs) if e["msg"] == "bootstrap consume failed"]
    assert len(failed) == 1
    assert failed[0]["level"] == "warning" and failed[0]["reason"] == reason
    assert failed[0]["status"] == answered
    line = orjson.dumps(failed[0]).decode()
    assert "ticket-secret-42" not in line and SERVICE_TOKEN not in line
