"""Transfer codings on both HTTP paths (the ``/acp/rpc`` front and aiohttp), with raw
sockets on 127.0.0.1 against the in-process daemon (RFC 9112 §6.1, §6.3): a lone
``chunked`` is read; ``chunked`` after a coding the bridge does not implement is
answered 501 and the connection closed, the body never read as JSON."""

from __future__ import annotations

import gzip

import pytest

from tests.conftest import StartBridge, base_env
from tests.integration.test_front import Client, get, post
from tests.integration.test_front_framing import AUTH, CAPS, chunk, raw

#: ``chunked`` is the final coding (the body can be framed), another comes before it
UNSUPPORTED = ["gzip, chunked", "deflate, chunked", "identity, chunked", "x;q=1, chunked"]
BODY = chunk(gzip.compress(CAPS)) + b"0\r\n\r\n"
NOT_IMPLEMENTED = b"501 not implemented: the only transfer coding taken is chunked\n"


def coded(coding: str, path: str = "/acp/rpc", version: str = "1.1") -> bytes:
    request = raw(f"Transfer-Encoding: {coding}\r\n\r\n", BODY)
    return request.replace(b"/acp/rpc HTTP/1.1", f"{path} HTTP/{version}".encode(), 1)


@pytest.mark.parametrize("coding", UNSUPPORTED)
async def test_a_coding_before_chunked_is_501_and_closes_on_both_paths(
    start_bridge: StartBridge, coding: str
) -> None:
    bridge = await start_bridge()
    cases = [
        (b"", coded(coding)),  # the connection's first request: the front's
        (post(), coded(coding)),  # behind one the front answered
        (get("/livez"), coded(coding)),  # on a connection aiohttp owns
        (b"", coded(coding, "/api/ping")),  # another route: aiohttp's
        (b"", coded(coding, "/nowhere")),
    ]
    for prefix, request in cases:
        client = await Client.open(bridge.port)
        await client.send(prefix + request + post())
        if prefix:
            assert (await client.answer()).status == 200
        answer = await client.answer()
        assert (answer.status, answer.body) == (501, NOT_IMPLEMENTED), (prefix, request)
        assert answer.header("Connection") == "close"
        assert await client.closed()
        assert not client.done  # nothing read after the body it did not frame


async def test_transfer_encoding_in_http_1_0_is_400_and_closes(start_bridge: StartBridge) -> None:
    """RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing."""
    bridge = await start_bridge()
    for path in ("/acp/rpc", "/api/ping"):
        request = coded("chunked", path, "1.0").replace(BODY, chunk(CAPS) + b"0\r\n\r\n")
        client = await Client.open(bridge.port)
        await client.send(request)  # (nothing after it: HTTP/1.0 closes)
        answer = await client.answer()
        assert (answer.status, answer.body) == (400, b"400 bad request\n"), path
        assert await client.closed()


async def test_an_expect_with_an_unsupported_coding_gets_no_100_continue(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    head = "POST /acp/rpc HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + AUTH
    client = await Client.open(bridge.port)
    await client.send(f"{head}Transfer-Encoding: gzip, chunked\r\n\r\n".encode())
    answer = await client.answer()
    assert answer.status == 501 and answer.header("Connection") == "close"
    client.close()


@pytest.mark.parametrize("path", ["/api/ping", "/console/ws", "/nowhere"])
async def test_an_expect_with_an_unsupported_coding_gets_no_100_on_other_routes(
    start_bridge: StartBridge, path: str
) -> None:
    # aiohttp's routes (and its catch-all): the refusal, not 100 Continue before it
    bridge = await start_bridge()
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + AUTH
    client = await Client.open(bridge.port)
    await client.send(f"{head}Transfer-Encoding: gzip, chunked\r\n\r\n".encode())
    answer = await client.answer()
    assert (answer.status, answer.body) == (501, NOT_IMPLEMENTED), path
    assert answer.header("Connection") == "close"
    client.close()  # (aiohttp lingers a while for the body it did not invite)


async def test_an_expect_from_a_foreign_host_gets_421_not_100(start_bridge: StartBridge) -> None:
    # a bridge without a token checks Host: refused before the body is invited
    bridge = await start_bridge(env=base_env())
    head = "POST /api/ping HTTP/1.1\r\nHost: evil.example\r\nExpect: 100-continue\r\n"
    client = await Client.open(bridge.port)
    await client.send(f"{head}Content-Length: 5\r\n\r\n".encode())
    answer = await client.answer()
    assert answer.status == 421 and answer.header("Connection") == "close"
    client.close()
