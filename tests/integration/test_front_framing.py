"""How the ``/acp/rpc`` front (transport/front.py) frames what it parses, against the
in-process daemon with raw sockets on 127.0.0.1: smuggling vectors (both lengths,
repeated or listed lengths, codings other than a final ``chunked``, folded lines,
bare LF) are refused with 400 and the connection closed, never desynchronised; other
paths are aiohttp's; pipelining, ``Connection: close`` and HTTP/1.0; and the same
request is answered alike by the front and by aiohttp (a connection aiohttp owns)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    StartBridge,
    base_env,
    providers_config,
    session_params,
    wait_until,
)
from tests.integration.test_front import Client, get, kept, post

AUTH = f"Authorization: Bearer {TOKEN}\r\n"
CAPS = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
HEAD = "POST /acp/rpc HTTP/1.1\r\nHost: x\r\n" + AUTH


def raw(head: str, body: bytes = b"") -> bytes:
    return (HEAD + head).encode() + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


#: framings a request must not be read with: each is refused (400) and closes
MALFORMED = {
    "content-length-and-chunked": raw(
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", b"0\r\n\r\n"
    ),
    "two-content-lengths": raw("Content-Length: 2\r\nContent-Length: 2\r\n\r\n", b"{}"),
    "conflicting-content-lengths": raw("Content-Length: 2\r\nContent-Length: 3\r\n\r\n", b"{}"),
    "content-length-list": raw("Content-Length: 2, 2\r\n\r\n", b"{}"),
    "content-length-signed": raw("Content-Length: +2\r\n\r\n", b"{}"),
    "content-length-overflow": raw("Content-Length: 99999999999999999999999\r\n\r\n"),
    "chunked-then-identity": raw("Transfer-Encoding: chunked, identity\r\n\r\n", b"0\r\n\r\n"),
    "unknown-coding": raw("Transfer-Encoding: gzip\r\n\r\n", b"0\r\n\r\n"),
    "identity": raw("Transfer-Encoding: identity\r\n\r\n", b"0\r\n\r\n"),
    "chunked-twice-in-one-field": raw("Transfer-Encoding: chunked, chunked\r\n\r\n", b"0\r\n\r\n"),
    "empty-transfer-encoding": raw("Transfer-Encoding: \r\n\r\n", b"0\r\n\r\n"),
    "chunked-with-a-parameter": raw("Transfer-Encoding: chunked;a=b\r\n\r\n", b"0\r\n\r\n"),
    "two-transfer-encodings": raw(
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", b"0\r\n\r\n"
    ),
    "chunk-size-overflow": raw("Transfer-Encoding: chunked\r\n\r\n", b"fffffffffffffffff\r\n"),
    "chunk-size-bare-lf": raw("Transfer-Encoding: chunked\r\n\r\n", b"2\n{}\n0\n\n"),
    "obs-fold": raw("X-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n"),
    "bare-lf-head": b"POST /acp/rpc HTTP/1.1\nHost: x\n" + AUTH[:-2].encode() + b"\n\n",
    "bare-lf-in-a-header": raw("X-A: 1\nContent-Length: 0\r\n\r\n"),
    "space-before-colon": raw("Content-Length : 2\r\n\r\n", b"{}"),
    "nul-in-a-value": raw("X-A: a\x00b\r\nContent-Length: 0\r\n\r\n"),
    "lower-case-method": raw("Content-Length: 2\r\n\r\n", b"{}").replace(b"POST", b"post", 1),
}


@pytest.mark.parametrize("name", MALFORMED)
async def test_a_malformed_framing_is_refused_and_never_desynchronises(
    start_bridge: StartBridge, name: str
) -> None:
    bridge = await start_bridge()
    bad = MALFORMED[name]
    first = await Client.open(bridge.port)  # the connection's first bytes
    await first.send(bad + post())
    assert (await first.answer()).status == 400
    assert await first.closed()
    assert not first.done  # the request behind it was not read from a wrong byte
    piped = await Client.open(bridge.port)  # behind a request the front kept
    await piped.send(post() + bad + post())
    assert (await piped.answer()).json()["id"] == 1
    answer = await piped.answer()
    assert answer.status == 400 and answer.header("Connection") == "close"
    assert await piped.closed()
    assert not piped.done


#: framings that are sound: answered, and the request behind it read from the right byte
SOUND = {
    "chunk-extension": raw("Transfer-Encoding: chunked\r\n\r\n", b"%x;a=b\r\n%b\r\n0\r\n\r\n")
    % (len(CAPS), CAPS),
    "chunked-in-capitals": raw("Transfer-Encoding: CHUNKED\r\n\r\n", chunk(CAPS) + b"0\r\n\r\n"),
    "chunks-of-one-byte": raw(
        "Transfer-Encoding: chunked\r\n\r\n",
        b"".join(chunk(CAPS[i : i + 1]) for i in range(len(CAPS))) + b"0\r\n\r\n",
    ),
    "length-with-spaces": raw(f"Content-Length:  {len(CAPS)} \r\n\r\n", CAPS),
    "crlf-after-the-body": raw(f"Content-Length: {len(CAPS)}\r\n\r\n", CAPS + b"\r\n"),
    # more digits than int() takes (4300): the front's int(length) raised in the parser
    "length-with-5000-leading-zeros": raw(f"Content-Length: {len(CAPS):05000d}\r\n\r\n", CAPS),
}


@pytest.mark.parametrize("name", SOUND)
async def test_a_sound_framing_keeps_the_connection_in_step(
    start_bridge: StartBridge, name: str
) -> None:
    bridge = await start_bridge()
    for prefix in (b"", post(), get("/livez")):  # first bytes; the front's; aiohttp's
        client = await Client.open(bridge.port)
        await client.send(prefix + SOUND[name] + post())
        answers = [await client.answer() for _ in range(3 if prefix else 2)]
        assert [a.status for a in answers] == [200] * len(answers)
        assert answers[-1].json()["id"] == 1 and answers[-2].json()["id"] == 1
        client.close()


PATHS = [
    "//acp/rpc",
    "/acp/rpc/",
    "/ACP/RPC",
    "/acp/%72pc",
    "/acp/./rpc",
    "/acp/rpc#frag",
    "http://x/acp/rpc",
    "*",
]


async def answered_by_aiohttp(port: int, request: bytes) -> Any:
    client = await Client.open(port)
    await client.send(get("/livez"))
    assert (await client.answer()).status == 200
    await client.send(request)
    answer = await client.answer()
    client.close()
    return answer


@pytest.mark.parametrize("path", PATHS)
async def test_another_request_target_is_answered_as_aiohttp_answers_it(
    start_bridge: StartBridge, path: str
) -> None:
    bridge = await start_bridge()
    request = post(path=path)
    expected = await answered_by_aiohttp(bridge.port, request)
    first = await Client.open(bridge.port)
    await first.send(request)
    answer = await first.answer()
    assert (answer.status, answer.body) == (expected.status, expected.body)
    later = await Client.open(bridge.port)  # a later read on a kept connection: the same
    await later.send(post())
    assert (await later.answer()).status == 200
    await later.send(request)
    answer = await later.answer()
    assert (answer.status, answer.body) == (expected.status, expected.body)
    piped = await Client.open(bridge.port)  # pipelined: closed after the answer before it
    await piped.send(post() + request)
    assert (await piped.answer()).json()["id"] == 1
    assert await piped.closed()
    assert not piped.done


async def test_pipelined_batches_connection_close_and_http_1_0(start_bridge: StartBridge) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    sse = post(extra="Accept: text/event-stream\r\n")
    await client.send(post() + sse + post() + sse + post())  # JSON and SSE, one write
    answers = [await client.answer() for _ in range(5)]
    assert [a.header("Content-Type") for a in answers] == [
        "application/json",
        "text/event-stream",
    ] * 2 + ["application/json"]
    assert all(b'"id":1' in a.body for a in answers)
    # Connection: close is honoured: said on the answer, the socket closes, nothing after
    await client.send(post(extra="Connection: close\r\n") + post())
    answer = await client.answer()
    assert answer.status == 200 and answer.header("Connection") == "close"
    assert await client.closed()
    assert not client.done
    # HTTP/1.0: closed after the answer, or kept with keep-alive (aiohttp's)
    for extra, keeps in (("", False), ("Connection: keep-alive\r\n", True)):
        old = await Client.open(bridge.port)
        await old.send(post(extra=extra).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
        assert (await old.answer()).json()["id"] == 1
        if keeps:
            await old.send(post().replace(b"HTTP/1.1", b"HTTP/1.0", 1))
            assert (await old.answer()).json()["id"] == 1
            old.close()
        else:
            assert await old.closed()
    # a client that closes in the middle of a batch leaves nothing behind
    gone = await Client.open(bridge.port)
    await gone.send(post() * 6)
    gone.writer.transport.abort()
    await wait_until(lambda: bridge.server.front is not None and not bridge.server.front.kept)
    assert await kept(bridge) == 0
    alive = await Client.open(bridge.port)
    await alive.send(post())
    assert (await alive.answer()).json()["id"] == 1
    alive.close()


AUTH_HEADERS = {
    "exact": f"Authorization: Bearer {TOKEN}\r\n",
    "odd-casing-and-spaces": f"authorization:   bEaReR {TOKEN}  \r\n",
    "raw-token": f"Authorization: {TOKEN}\r\n",
    "tab-separated": f"Authorization: Bearer\t{TOKEN}\r\n",
    "two-spaces": f"Authorization: Bearer  {TOKEN}\r\n",
    "wrong-token": "Authorization: Bearer wrong\r\n",
    "basic": "Authorization: Basic eDp5\r\n",
    "bare-bearer": "Authorization: Bearer\r\n",
    "empty": "Authorization: \r\n",
    "none": "",
    "wrong-then-right": f"Authorization: Bearer wrong\r\nAuthorization: Bearer {TOKEN}\r\n",
    "right-then-wrong": f"Authorization: Bearer {TOKEN}\r\nAuthorization: Bearer wrong\r\n",
    "disallowed-origin": AUTH + "Origin: https://evil.example\r\n",
    "allowed-origin": AUTH + "Origin: http://localhost:3000\r\n",
    "origin-with-path": AUTH + "Origin: http://localhost:3000/x\r\n",
    "empty-origin": AUTH + "Origin: \r\n",
}


async def test_auth_and_origin_are_decided_alike_by_the_front_and_by_aiohttp(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    for name, extra in AUTH_HEADERS.items():
        request = post(extra=extra, auth=False)
        expected = await answered_by_aiohttp(bridge.port, request)
        client = await Client.open(bridge.port)
        await client.send(request)
        answer = await client.answer()
        client.close()
        cors = [(k, v) for k, v in answer.headers if k.startswith("Access-Control") or k == "Vary"]
        want = [
            (k, v) for k, v in expected.headers if k.startswith("Access-Control") or k == "Vary"
        ]
        assert (answer.status, answer.body, cors) == (expected.status, expected.body, want), name


async def test_chunked_trailers_are_not_request_headers(start_bridge: StartBridge) -> None:
    """aiohttp drops trailers; the front took them as headers (``Accept`` in a trailer
    turned a plain answer into SSE)."""
    bridge = await start_bridge()
    body = chunk(CAPS) + b"0\r\nAccept: text/event-stream\r\nX-Trailer: 1\r\n\r\n"
    request = raw("Transfer-Encoding: chunked\r\n\r\n", body)
    for prefix in (b"", post()):  # the first request, and one pipelined behind another
        client = await Client.open(bridge.port)
        await client.send(prefix + request + post())
        answers = [await client.answer() for _ in range(3 if prefix else 2)]
        assert [a.header("Content-Type") for a in answers] == ["application/json"] * len(answers)
        assert answers[-2].json()["id"] == 1
        client.close()


#: heads aiohttp refuses with 400 (RFC 9112 §3.2; RFC 9110 singleton fields)
REFUSED_HEADS = {
    "no-host": post().replace(b"Host: x\r\n", b""),
    "two-hosts": post(extra="Host: y\r\n"),
    "two-content-types": post(extra="Content-Type: text/plain\r\n"),
    "two-user-agents": post(extra="User-Agent: a\r\nUser-Agent: b\r\n"),
}


@pytest.mark.parametrize("name", REFUSED_HEADS)
async def test_a_head_aiohttp_refuses_is_not_answered_by_the_front(
    start_bridge: StartBridge, name: str
) -> None:
    bridge = await start_bridge()
    bad = REFUSED_HEADS[name]
    expected = await answered_by_aiohttp(bridge.port, bad)
    assert expected.status == 400
    first = await Client.open(bridge.port)
    await first.send(bad)
    answer = await first.answer()
    assert (answer.status, answer.body) == (400, expected.body)
    piped = await Client.open(bridge.port)  # pipelined: closed after the answer before it
    await piped.send(post() + bad)
    assert (await piped.answer()).json()["id"] == 1
    assert await piped.closed()
    assert not piped.done


def expecting(length: int, extra: str = AUTH) -> bytes:
    head = "POST /acp/rpc HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + extra
    return f"{head}Content-Length: {length}\r\n\r\n".encode()


async def test_expect_100_continue_is_refused_before_the_body_when_it_would_be(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """aiohttp's default answered 100 Continue first, inviting a body it then refused
    (too large) or dropped (no bearer, foreign origin)."""
    bridge = await start_bridge(config={"limits": {"max_body_bytes": 1000}}, tmp=tmp_path)
    for prefix in (b"", post(), get("/livez")):  # first bytes; after the front's; aiohttp's
        client = await Client.open(bridge.port)
        await client.send(prefix)
        if prefix:
            assert (await client.answer()).status == 200
        await client.send(expecting(5000))
        answer = await client.answer()
        assert answer.status == 413 and answer.json()["error"]["code"] == -32600
        assert answer.header("Connection") == "close"
        client.close()
        client = await Client.open(bridge.port)
        await client.send(prefix)
        if prefix:
            assert (await client.answer()).status == 200
        await client.send(expecting(len(CAPS), extra="Origin: https://evil.example\r\n"))
        answer = await client.answer()
        assert answer.status == 403 and answer.header("Connection") == "close"
        client.close()
    client = await Client.open(bridge.port)
    await client.send(expecting(len(CAPS), extra=""))
    answer = await client.answer()
    assert answer.status == 401 and answer.json()["error"]["code"] == -32001
    client.close()
    client = await Client.open(bridge.port)  # admitted: 100, then the answer
    await client.send(expecting(len(CAPS)))
    assert (await client.answer()).status == 100
    await client.send(CAPS)
    assert (await client.answer()).json()["id"] == 1
    await client.send(post())  # and the connection is kept
    assert (await client.answer()).json()["id"] == 1
    client.close()


async def test_expect_with_a_length_of_many_leading_zeros_is_read_as_its_number(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """``rpc_expect`` read it with aiohttp's ``content_length`` (``int``: at most 4300
    digits): 500 instead of 413 (or 100)."""
    bridge = await start_bridge(config={"limits": {"max_body_bytes": 1000}}, tmp=tmp_path)
    for length, status in ((5000, 413), (len(CAPS), 100)):
        head = expecting(length).replace(b"Length: ", b"Length: " + b"0" * 5000)
        client = await Client.open(bridge.port)
        await client.send(head)
        assert (await client.answer()).status == status
        client.close()


async def test_a_refused_request_announcing_a_body_over_the_limit_is_answered_at_once(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """The front read such a body up to the limit (or waited for it until the body
    deadline) before answering its 401/403; aiohttp answers without reading it."""
    config = {"limits": {"max_body_bytes": 1000, "request_read_timeout": 60}}
    bridge = await start_bridge(config=config, tmp=tmp_path)
    head = "POST /acp/rpc HTTP/1.1\r\nHost: x\r\n{}Content-Length: 100000\r\n\r\n"
    for extra, status in (("", 401), (AUTH + "Origin: https://evil.example\r\n", 403)):
        for prefix in (b"", post()):
            client = await Client.open(bridge.port)
            await client.send(prefix + head.format(extra).encode())  # and no body
            if prefix:
                assert (await client.answer()).status == 200
            answer = await client.answer()
            assert answer.status == status and answer.header("Connection") == "close"
            assert await client.closed()


#: heads over aiohttp's limits (8190 bytes of request line or of one field, 128 field
#: lines): aiohttp answers 400
OVER_LIMITS = {
    "long-field": post(extra="X-Big: " + "a" * 8191 + "\r\n"),
    "long-request-target": post(path="/acp/rpc?" + "a" * 8190),
    "129-field-lines": post(extra="X-Same: 1\r\n" * 125),
}


@pytest.mark.parametrize("name", OVER_LIMITS)
async def test_a_head_over_aiohttp_s_limits_is_not_answered_by_the_front(
    start_bridge: StartBridge, name: str
) -> None:
    bridge = await start_bridge()
    bad = OVER_LIMITS[name]
    expected = await answered_by_aiohttp(bridge.port, bad)
    assert expected.status == 400
    for prefix in (b"", post()):  # the first bytes, and a later read of a kept connection
        client = await Client.open(bridge.port)
        if prefix:
            await client.send(prefix)
            assert (await client.answer()).status == 200
        await client.send(bad)
        answer = await client.answer()
        assert (answer.status, answer.body) == (400, expected.body)
        client.close()
    piped = await Client.open(bridge.port)  # pipelined: refused here, or closed unanswered
    await piped.send(post() + bad)
    assert (await piped.answer()).json()["id"] == 1
    assert await piped.closed()
    assert all(a.status in (400, 431) for a in piped.done)


async def test_a_large_head_handed_to_aiohttp_is_not_cut_off_by_the_header_deadline(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """A head over the front's 64 KiB but within aiohttp's limits is handed over before
    it is complete; the header deadline was never told of its end, so it answered 408
    into the connection aiohttp was serving and closed it."""
    config = {"limits": {"header_read_timeout": 0.5}}
    bridge = await start_bridge(config=config, tmp=tmp_path)
    big = "".join(f"X-Big-{i}: {'a' * 7000}\r\n" for i in range(10))
    client = await Client.open(bridge.port)
    await client.send(post(extra=big))
    assert (await client.answer()).json()["id"] == 1
    later = await Client.open(bridge.port)  # opened after: its deadline passes later
    await later.send(b"POST /acp/rpc HTTP/1.1\r\nHost: x\r\n")  # and never ends its head
    assert (await later.answer()).status == 408
    await client.send(post())
    answer = await client.answer()
    assert answer.status == 200 and answer.json()["id"] == 1
    client.close()
    slow = await Client.open(bridge.port)  # such a head that never ends is still cut off
    await slow.send(post(extra=big).partition(b"\r\n\r\n")[0])
    assert (await slow.answer()).status == 408
    assert await slow.closed()


def ws_text(payload: bytes) -> bytes:
    """A client's (masked) WebSocket text frame."""
    mask = b"\x01\x02\x03\x04"
    size = len(payload)
    head = bytes([0x81, 0x80 | size]) if size < 126 else bytes([0x81, 0xFE]) + size.to_bytes(2)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def ws_message(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(5):
        first, second = await reader.readexactly(2)
        assert first == 0x81 and not second & 0x80  # a text frame, unmasked
        size = second & 0x7F
        if size == 126:
            size = int.from_bytes(await reader.readexactly(2))
        elif size == 127:
            size = int.from_bytes(await reader.readexactly(8))
        return await reader.readexactly(size)


async def test_a_websocket_upgrade_after_a_front_request_on_one_connection(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    await client.send(post())
    assert (await client.answer()).json()["id"] == 1
    assert await kept(bridge) == 1
    key = base64.b64encode(b"0123456789abcdef").decode()
    upgrade = (
        f"GET /acp HTTP/1.1\r\nHost: x\r\n{AUTH}Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await client.send(upgrade.encode())
    async with asyncio.timeout(5):
        head = await client.reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    assert await kept(bridge) == 0  # aiohttp's now
    await client.send(ws_text(CAPS))
    assert orjson.loads(await ws_message(client.reader))["result"]["capabilities"]
    client.close()


async def test_a_preflight_on_a_kept_connection_is_answered_as_on_a_new_one(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    preflight = (
        b"OPTIONS /acp/rpc HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:3000\r\n"
        b"Access-Control-Request-Method: POST\r\n\r\n"
    )
    fresh = await Client.open(bridge.port)
    await fresh.send(preflight)
    expected = await fresh.answer()
    assert expected.status == 204 and expected.header("Access-Control-Allow-Origin")
    client = await Client.open(bridge.port)
    await client.send(post())
    assert (await client.answer()).json()["id"] == 1
    await client.send(preflight)
    answer = await client.answer()
    assert answer.status == 204 and answer.body == b""
    skip = ("Date",)
    assert [h for h in answer.headers if h[0] not in skip] == [
        h for h in expected.headers if h[0] not in skip
    ]
    await client.send(post())  # and the connection goes on
    assert (await client.answer()).json()["id"] == 1
    client.close()
    fresh.close()


async def test_a_misdirected_request_gets_no_cors_headers_on_either_path(
    start_bridge: StartBridge,
) -> None:
    """A bridge without a token refuses a foreign ``Host`` with 421; aiohttp's answer
    (its middleware, before the route) has no CORS headers, the front's had them."""
    bridge = await start_bridge(env=base_env())  # no ACP_AUTH_TOKEN: Host is checked
    request = post(extra="Origin: http://localhost:3000\r\n").replace(
        b"Host: x", b"Host: evil.example"
    )
    owned = await Client.open(bridge.port)  # a connection aiohttp owns
    await owned.send(get("/livez").replace(b"Host: x", b"Host: localhost"))
    assert (await owned.answer()).status == 200
    await owned.send(request)
    expected = await owned.answer()
    owned.close()
    client = await Client.open(bridge.port)
    await client.send(request)
    answer = await client.answer()
    client.close()
    skip = ("Date", "Server")
    assert answer.status == expected.status == 421
    assert answer.header("Access-Control-Allow-Origin") is None
    assert [h for h in answer.headers if h[0] not in skip] == [
        h for h in expected.headers if h[0] not in skip
    ]


async def test_the_body_deadline_does_not_run_while_the_front_is_not_reading(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """With 8 requests waiting behind a long one the front stops reading; a body that
    had begun then could not arrive, yet its deadline ran on and refused it (400 and
    close), though the client was not slow: aiohttp starts a body's deadline only
    when its request is handled."""
    config = providers_config(
        {"id": "codex", "endpoint": fake_upstream.url},
        limits={"request_read_timeout": 0.5},
    )
    bridge = await start_bridge(config=config, tmp=tmp_path)
    release = fake_upstream.state.holds["held"] = asyncio.Event()
    turn = {"jsonrpc": "2.0", "id": 0, "method": "session.start"}
    turn["params"] = session_params("held")
    last = post(CAPS)
    cut = len(last) - 10
    client = await Client.open(bridge.port)
    await client.send(post(orjson.dumps(turn)) + post() * 8 + last[:cut])  # and the rest later
    await wait_until(lambda: "held" in fake_upstream.state.active)
    slow = await Client.open(bridge.port)  # a later body deadline, and it passes
    await slow.send(post(CAPS)[:-10])
    assert (await slow.answer()).status == 400
    release.set()
    answers = [await client.answer() for _ in range(9)]
    assert [a.status for a in answers] == [200] * 9
    await client.send(last[cut:])
    answer = await client.answer()
    assert answer.status == 200 and answer.json()["id"] == 1
    client.close()


async def test_a_header_that_never_ends_is_cut_off_at_the_head_limit(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """httptools hands over a field only once it is complete, so the head limits saw
    nothing of one still arriving: the front buffered it (twice, in its own copy of
    the head's reads too) for as long as the header deadline allowed."""
    bridge = await start_bridge(config={"limits": {"header_read_timeout": 60}}, tmp=tmp_path)
    start = b"POST /acp/rpc HTTP/1.1\r\nHost: x\r\nX-Endless: "
    for prefix, first in ((b"", True), (post(), True), (post(), False)):
        client = await Client.open(bridge.port)
        if prefix and first:  # a later read of a kept connection
            await client.send(prefix)
            assert (await client.answer()).status == 200
            prefix = b""

        async def endless(client: Client = client, prefix: bytes = prefix) -> None:
            with contextlib.suppress(ConnectionError):
                await client.send(prefix + start)
                for _ in range(256):  # 16 MiB, unless the server stops it first
                    await client.send(b"a" * 65536)

        feeding = asyncio.create_task(endless())
        try:
            if prefix:  # pipelined behind a request in the same read
                assert (await client.answer()).status == 200
            answer = await client.answer()
            assert answer.status in (400, 431)
        finally:
            feeding.cancel()
            client.writer.transport.abort()


async def test_a_trailer_that_never_ends_is_cut_off(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    """The same for a chunked body's trailer: buffered by httptools until the body
    deadline."""
    config = {"limits": {"request_read_timeout": 60}}
    bridge = await start_bridge(config=config, tmp=tmp_path)
    client = await Client.open(bridge.port)
    body = chunk(CAPS) + b"0\r\nX-Endless: "

    async def endless() -> None:
        with contextlib.suppress(ConnectionError):
            await client.send(raw("Transfer-Encoding: chunked\r\n\r\n", body))
            for _ in range(256):  # 16 MiB, unless the server stops it first
                await client.send(b"a" * 65536)

    feeding = asyncio.create_task(endless())
    try:
        answer = await client.answer()
        assert answer.status == 400 and answer.header("Connection") == "close"
    finally:
        feeding.cancel()
        client.writer.transport.abort()
    small = await Client.open(bridge.port)  # a body in small chunks is still read
    data = CAPS * 20
    pieces = b"".join(chunk(data[i : i + 8]) for i in range(0, len(data), 8))
    await small.send(raw("Transfer-Encoding: chunked\r\n\r\n", pieces[:50]))
    await small.send(pieces[50:] + b"0\r\n\r\n")
    answer = await small.answer()  # read whole (then not JSON): not cut off
    assert answer.status == 400 and answer.json()["error"]["code"] == -32700
    small.close()


async def test_pipelined_heads_split_across_large_reads_are_not_refused(
    start_bridge: StartBridge,
) -> None:
    """A read that went on with a head begun in an earlier one was counted whole
    against the 64 KiB head limit, the requests after that head too: a pipelining
    client whose reads (up to 256 KiB) began inside a head got 431 and a closed
    connection for requests of 4 KiB."""
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    await client.send(post())
    assert (await client.answer()).json()["id"] == 1
    pad = "X-Pad: " + "a" * 4000 + "\r\n"  # nearly every read boundary falls in a head
    bodies = [
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "acp.capabilities"}) for i in range(400)
    ]
    sending = asyncio.create_task(client.send(b"".join(post(b, extra=pad) for b in bodies)))
    ids = []
    for _ in bodies:
        answer = await client.answer()
        assert answer.status == 200, answer.body
        ids.append(answer.json()["id"])
    await sending
    assert ids == list(range(400))
    assert await kept(bridge) == 1
    client.close()


async def test_an_sse_answer_to_connection_close_says_so_on_both_paths(
    start_bridge: StartBridge,
) -> None:
    """The front's chunked SSE head had no ``Connection: close`` for a request that
    asked for one (its plain JSON answers, and aiohttp's SSE ones, have it: RFC 9112
    §9.6); the connection closed after the answer all the same."""
    bridge = await start_bridge()
    sse = post(extra="Accept: text/event-stream\r\nConnection: close\r\n")
    for first in (b"", get("/livez")):  # the front's, then aiohttp's
        client = await Client.open(bridge.port)
        if first:
            await client.send(first)
            assert (await client.answer()).status == 200
        await client.send(sse)
        answer = await client.answer()
        assert answer.header("Content-Type") == "text/event-stream"
        assert answer.header("Connection") == "close", answer.headers
        assert b'"id":1' in answer.body
        assert await client.closed()
