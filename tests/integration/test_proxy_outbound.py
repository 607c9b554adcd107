"""HTTP_PROXY / HTTPS_PROXY / NO_PROXY (config.md §2.1) for every outbound kind, against
the in-test forward proxy of ``tests/forward_proxy.py``: the upstream HTTP/1.1 client
(absolute form; CONNECT + TLS), upstream and gateway WebSocket dials (CONNECT), the
shared aiohttp session (LLM, accounts), Vault, and ``doctor``."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from internal.peers.fake_gateway import FakeGateway, FakeGatewayState
from tests.conftest import FakeUpstream, closed_port
from tests.forward_proxy import ForwardProxy
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.config import (
    BridgeConfig,
    GatewayConfig,
    ProviderConfig,
    StoreConfig,
    ToolbridgeConfig,
    load_config,
)
from xwm_bridge.doctor import run_checks
from xwm_bridge.endpoint import derive_endpoint
from xwm_bridge.gateway import dial
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.providers.http1_pool import Http1Pool
from xwm_bridge.providers.upstream import UpstreamClient, UpstreamError
from xwm_bridge.proxy import ProxySettings, aiohttp_session_options
from xwm_bridge.toolbridge.tools import ToolError
from xwm_bridge.toolbridge.vault import vault_kv

SECRET = "s3cr3t-pw"
BASIC = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()


@pytest.fixture
async def proxy() -> AsyncIterator[ForwardProxy]:
    p = ForwardProxy()
    await p.start()
    try:
        yield p
    finally:
        await p.close()


def settings(proxy: ForwardProxy, no_proxy: str = "") -> ProxySettings:
    url = f"http://user:{SECRET}@127.0.0.1:{proxy.port}"
    return ProxySettings.from_env({"HTTP_PROXY": url, "HTTPS_PROXY": url, "NO_PROXY": no_proxy})


def provider(endpoint: str, timeout: float = 5.0) -> ProviderConfig:
    return ProviderConfig(
        id="codex",
        endpoint=endpoint,
        stream=False,
        connect_timeout=timeout,
        read_timeout=timeout,
        total_timeout=timeout + 5,
    )


async def capabilities(
    endpoint: str, proxies: ProxySettings, pool: Http1Pool | None = None, deadline: float = 5.0
) -> dict[str, Any]:
    async def ignore(_: list[dict[str, Any]]) -> None:
        return None

    pool = pool or Http1Pool()
    try:
        client = UpstreamClient(pool, proxies)
        return await client.call(
            provider(endpoint, deadline),
            derive_endpoint(endpoint),
            "",
            "acp.capabilities",
            {},
            ignore,
            stream=False,
        )
    finally:
        await pool.close()


# --- the upstream HTTP/1.1 client ------------------------------------------------------


async def test_upstream_http_goes_to_the_proxy_in_absolute_form(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    reply = await capabilities(fake_upstream.url, settings(proxy))
    assert "result" in reply
    [seen] = proxy.seen
    assert (seen.method, seen.target) == ("POST", f"{fake_upstream.url}/acp/rpc")
    assert seen.headers["proxy-authorization"] == BASIC
    # the upstream itself never sees the proxy's credentials
    assert not any("proxy-authorization" in r["headers"] for r in fake_upstream.state.requests)


async def test_upstream_http_to_a_no_proxy_host_goes_direct(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    reply = await capabilities(fake_upstream.url, settings(proxy, no_proxy="example.org,127.0.0.1"))
    assert "result" in reply  # answered: a proxied request would have been seen first
    assert proxy.seen == []


def _tls_pair(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: (server context, client context)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_path, key_path)
    client = ssl.create_default_context(cafile=str(cert_path))
    return server, client


@pytest.fixture
async def tls_upstream(tmp_path: Path) -> AsyncIterator[tuple[str, ssl.SSLContext]]:
    """An HTTPS JSON-RPC upstream on 127.0.0.1; yields (base URL, client TLS context)."""
    server_ctx, client_ctx = _tls_pair(tmp_path)

    async def rpc(request: web.Request) -> web.Response:
        doc = await request.json()
        return web.json_response({"jsonrpc": "2.0", "id": doc["id"], "result": {"ok": True}})

    app = web.Application()
    app.router.add_post("/acp/rpc", rpc)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}", client_ctx
    finally:
        await runner.cleanup()


async def test_upstream_https_goes_through_a_connect_tunnel_then_tls(
    proxy: ForwardProxy, tls_upstream: tuple[str, ssl.SSLContext]
) -> None:
    url, client_ctx = tls_upstream
    reply = await capabilities(url, settings(proxy), Http1Pool(ssl_context=client_ctx))
    assert reply["result"] == {"ok": True}
    [seen] = proxy.seen
    assert (seen.method, seen.target) == ("CONNECT", url.removeprefix("https://"))
    assert seen.headers["proxy-authorization"] == BASIC


async def test_a_proxy_refusing_connect_is_a_clear_error(
    proxy: ForwardProxy, tls_upstream: tuple[str, ssl.SSLContext]
) -> None:
    proxy.refuse = 407
    url, client_ctx = tls_upstream
    with pytest.raises(UpstreamError) as info:
        await capabilities(url, settings(proxy), Http1Pool(ssl_context=client_ctx))
    assert f"proxy 127.0.0.1:{proxy.port} refused CONNECT: 407" in str(info.value)
    assert SECRET not in str(info.value)


async def test_a_proxy_that_never_answers_connect_times_out(
    proxy: ForwardProxy, tls_upstream: tuple[str, ssl.SSLContext]
) -> None:
    proxy.hang = True
    url, client_ctx = tls_upstream
    with pytest.raises(UpstreamError) as info:
        await capabilities(url, settings(proxy), Http1Pool(ssl_context=client_ctx), deadline=0.3)
    assert info.value.timed_out
    assert f"via proxy 127.0.0.1:{proxy.port}: timed out" in str(info.value)


async def test_an_unreachable_proxy_is_named(fake_upstream: FakeUpstream) -> None:
    dead = ProxySettings.from_env({"HTTP_PROXY": f"http://user:{SECRET}@127.0.0.1:{closed_port()}"})
    with pytest.raises(UpstreamError) as info:
        await capabilities(fake_upstream.url, dead)
    assert "cannot connect to proxy 127.0.0.1:" in str(info.value)
    assert SECRET not in str(info.value)


# --- WebSocket dials -------------------------------------------------------------------


async def test_upstream_websocket_dials_through_connect(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    reply = await capabilities(fake_upstream.ws_url, settings(proxy))
    assert "result" in reply
    [seen] = proxy.seen
    assert (seen.method, seen.target) == ("CONNECT", fake_upstream.ws_url[5:-4])
    assert seen.headers["proxy-authorization"] == BASIC


async def test_upstream_websocket_refused_by_the_proxy_says_so(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    proxy.refuse = 403
    with pytest.raises(UpstreamError) as info:
        await capabilities(fake_upstream.ws_url, settings(proxy))
    assert f"proxy 127.0.0.1:{proxy.port} refused CONNECT: 403" in str(info.value)
    assert SECRET not in str(info.value)


async def test_upstream_websocket_to_a_no_proxy_host_goes_direct(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    reply = await capabilities(fake_upstream.ws_url, settings(proxy, no_proxy="127.0.0.0/8"))
    assert "result" in reply
    assert proxy.seen == []


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    gw = FakeGateway(FakeGatewayState())
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()


async def test_gateway_dial_goes_through_connect(proxy: ForwardProxy, gateway: FakeGateway) -> None:
    ws = await dial.open_socket(gateway.url, GatewayConfig(), "rt-1", settings(proxy))
    await dial.close_quietly(ws)
    [seen] = proxy.seen
    assert (seen.method, seen.target) == ("CONNECT", f"127.0.0.1:{gateway.port}")


async def test_gateway_dial_to_a_no_proxy_host_goes_direct(
    proxy: ForwardProxy, gateway: FakeGateway
) -> None:
    ws = await dial.open_socket(
        gateway.url, GatewayConfig(), "rt-1", settings(proxy, no_proxy=f"127.0.0.1:{gateway.port}")
    )
    await dial.close_quietly(ws)
    assert proxy.seen == []


async def test_gateway_dial_refused_by_the_proxy_logs_it_masked(
    proxy: ForwardProxy, gateway: FakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    proxy.refuse = 407
    with caplog.at_level(logging.INFO, "xwm_bridge.gateway"), pytest.raises(GatewayError):
        await dial.open_socket(gateway.url, GatewayConfig(), "rt-1", settings(proxy))
    [record] = [r for r in caplog.records if r.getMessage() == "gateway dial failed"]
    assert "refused CONNECT: 407" in record.error  # type: ignore[attr-defined]
    assert record.proxy == f"http://********@127.0.0.1:{proxy.port}"  # type: ignore[attr-defined]
    assert SECRET not in repr(record.__dict__)


# --- the aiohttp session (LLM, classifier, accounts) -----------------------------------


@pytest.fixture
async def echo_app(serve_app: Any) -> str:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response(
            {"path": request.path_qs, "proxied": "Proxy-Authorization" in request.headers}
        )

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    url: str = await serve_app(app)
    return url


async def test_bridge_http_session_goes_through_the_proxy(
    proxy: ForwardProxy, echo_app: str
) -> None:
    config = BridgeConfig(store=StoreConfig("memory"))
    url = f"{echo_app}/v1/chat/completions?x=1"
    async with (
        Bridge(config, proxies=settings(proxy)) as bridge,
        bridge.http.post(url, data=b"{}") as resp,
    ):
        assert await resp.json() == {"path": "/v1/chat/completions?x=1", "proxied": False}
    [seen] = proxy.seen
    assert (seen.method, seen.target) == ("POST", f"{echo_app}/v1/chat/completions?x=1")
    assert seen.headers["proxy-authorization"] == BASIC


async def test_aiohttp_session_to_a_no_proxy_host_goes_direct(
    proxy: ForwardProxy, echo_app: str
) -> None:
    options = aiohttp_session_options(settings(proxy, no_proxy=".0.0.1,127.0.0.1"))
    async with aiohttp.ClientSession(**options) as http, http.get(f"{echo_app}/x") as resp:
        assert resp.status == 200
    assert proxy.seen == []


async def test_aiohttp_connect_refused_is_a_clear_error(proxy: ForwardProxy) -> None:
    proxy.refuse = 407
    async with aiohttp.ClientSession(**aiohttp_session_options(settings(proxy))) as http:
        with pytest.raises(aiohttp.ClientConnectionError) as info:
            await http.get("https://127.0.0.1:9/")
    assert str(info.value) == f"proxy 127.0.0.1:{proxy.port} refused CONNECT: 407"


# --- Vault (hvac over requests) --------------------------------------------------------


async def test_vault_goes_through_the_proxy(proxy: ForwardProxy) -> None:
    port = closed_port()  # the proxy cannot reach it: the call fails after the proxy saw it
    cfg = ToolbridgeConfig(vault_url=f"http://127.0.0.1:{port}", vault_token="t", vault_timeout=5)
    with pytest.raises(ToolError):
        await vault_kv(cfg, {"operation": "read", "path": "app/db"}, settings(proxy))
    [seen] = proxy.seen
    assert seen.method == "GET"
    assert seen.target.startswith(f"http://127.0.0.1:{port}/v1/secret/data/app/db")
    assert seen.headers["proxy-authorization"] == BASIC


async def test_vault_to_a_no_proxy_host_goes_direct(proxy: ForwardProxy) -> None:
    cfg = ToolbridgeConfig(vault_url=f"http://127.0.0.1:{closed_port()}", vault_token="t")
    with pytest.raises(ToolError) as info:
        await vault_kv(cfg, {"operation": "read", "path": "a"}, settings(proxy, "127.0.0.1"))
    assert "ConnectionError" in str(info.value)  # refused directly
    assert proxy.seen == []


# --- doctor ----------------------------------------------------------------------------


async def test_doctor_shows_the_proxy_masked_and_checks_through_it(
    proxy: ForwardProxy, fake_upstream: FakeUpstream
) -> None:
    env = {
        "XWM_PROVIDER_CODEX_URL": fake_upstream.url,
        "XWM_AGENTS_DETECT": "false",
        "XWM_SESSION_STORE": "memory",
        "http_proxy": f"http://user:{SECRET}@127.0.0.1:{proxy.port}",
        "HTTP_PROXY": "http://ignored.invalid:1",
        "NO_PROXY": "example.org",
    }
    loaded = load_config(env=env)
    checks = await run_checks(loaded)
    text = orjson.dumps(checks).decode()
    assert SECRET not in text
    [row] = [c for c in checks if c["check"] == "proxy"]
    assert row["detail"] == (
        f"http: http://********@127.0.0.1:{proxy.port}; https: direct; no_proxy: example.org"
    )
    [codex] = [c for c in checks if c.get("provider") == "codex"]
    assert codex["ok"], codex
    assert codex["proxy"] == f"via http://********@127.0.0.1:{proxy.port}"
    assert [s.target for s in proxy.seen] == [f"{fake_upstream.url}/acp/rpc"]
