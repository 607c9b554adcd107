"""The terminal client's connection: it never waits forever on a bridge that went silent."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_reqrep import ConnectionKey
from aiohttp.test_utils import TestServer

from xwm_bridge import client as client_mod
from xwm_bridge.client import Client, ClientError


@pytest.fixture
async def mute_tcp() -> AsyncIterator[str]:
    """Accepts TCP connections and never answers (a hung process, a wrong port)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_connect_gives_up_after_the_connect_timeout(
    mute_tcp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_mod, "CONNECT_TIMEOUT", 0.2)
    with pytest.raises(ClientError, match="cannot reach the bridge"):
        async with asyncio.timeout(10):  # the test's own guard, not the client's
            async with Client(mute_tcp, "t"):
                pass


@pytest.fixture
async def silent_ws() -> AsyncIterator[tuple[str, asyncio.Event]]:
    """Upgrades to WebSocket, then never reads, answers or pongs (a stopped bridge)."""
    got_request = asyncio.Event()

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        got_request.set()
        await asyncio.Event().wait()  # cancelled when the server closes
        return ws

    app = web.Application()
    app.router.add_get("/acp", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}", got_request
    await server.close()


async def test_an_unbounded_call_fails_when_the_bridge_stops_answering_pings(
    silent_ws: tuple[str, asyncio.Event], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, connected = silent_ws
    monkeypatch.setattr(client_mod, "HEARTBEAT", 0.2)
    async with Client(url, "t") as c:
        await connected.wait()
        with pytest.raises(ClientError, match="closed the connection"):
            async with asyncio.timeout(10):  # the test's own guard, not the client's
                await c.call("bridge.watch", {}, wait_s=None)


async def test_a_call_after_the_bridge_closed_the_connection_fails_at_once() -> None:
    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/acp", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with Client(f"http://127.0.0.1:{server.port}", "t") as c:
            assert c._reader is not None
            await c._reader  # the close was read: nobody was waiting for an answer
            with pytest.raises(ClientError, match="closed the connection"):
                async with asyncio.timeout(10):  # the test's own guard, not the client's
                    await c.call("bridge.watch", {}, wait_s=None)
    finally:
        await server.close()


def test_why_a_connection_failed_is_a_few_words() -> None:
    key = ConnectionKey("proxy.test", 3128, False, True, None, None, None)
    refused = ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)")
    assert client_mod.unreachable(aiohttp.ClientConnectorError(key, refused)) == (
        "connection refused"
    )
    dns = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    assert client_mod.unreachable(aiohttp.ClientConnectorError(key, dns)) == (
        "name or service not known"
    )
    assert client_mod.unreachable(aiohttp.ClientProxyConnectionError(key, refused)) == (
        "the proxy proxy.test:3128: connection refused"
    )
    cert = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert.verify_message = "self-signed certificate"
    assert client_mod.unreachable(aiohttp.ClientConnectorCertificateError(key, cert)) == (
        "TLS certificate not trusted: self-signed certificate"
    )
    assert client_mod.unreachable(aiohttp.ServerDisconnectedError()) == "server disconnected"


@pytest.fixture
async def deaf_ws() -> AsyncIterator[str]:
    """Upgrades to WebSocket and answers pings, never a call (a hung handler, a stuck
    store): the connection stays up, the answer never comes."""

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()  # autoping: the heartbeat is answered
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get("/acp", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}"
    await server.close()


async def test_a_call_the_bridge_never_answers_is_a_client_error(deaf_ws: str) -> None:
    # `client list` against it printed a TimeoutError traceback after 30 s: the CLI
    # turns a ClientError into one line, and nothing else
    async with Client(deaf_ws, "t") as c:
        with pytest.raises(ClientError, match=r"session\.list: no answer .* within 0\.2s"):
            async with asyncio.timeout(10):  # the test's own guard, not the client's
                await c.call("session.list", {}, wait_s=0.2)
        assert not c._waiting  # the call it gave up on is forgotten


def test_a_negative_watch_count_is_a_usage_error() -> None:
    """``--count -1`` was taken (and stopped the watch after one event): a count of events
    is 0 (never stop) or more."""
    from click.testing import CliRunner

    from xwm_bridge.cli import cli

    result = CliRunner().invoke(cli, ["client", "watch", "--count", "-1"])
    assert result.exit_code == 2, result.output
    assert "--count" in result.output and "-1" in result.output
