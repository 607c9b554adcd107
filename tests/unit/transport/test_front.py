"""FrontProtocol without sockets: a fake transport, a fake endpoint, bytes in, bytes out."""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.transport import front_wire
from xwm_bridge.transport.exchange import JSON_HEADERS, Reply, RequestView, StreamOut
from xwm_bridge.transport.front import MAX_HEADERS, MAX_PIPELINED
from xwm_bridge.transport.front_server import Front
from xwm_bridge.transport.front_wire import (
    FIELD_KEYS,
    ChunkedStream,
    Headers,
    Request,
    field_key,
    header_lines,
)
from xwm_bridge.transport.guard import ConnectionGuard


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Endpoint:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.refused: list[str] = []
        self.gate: asyncio.Event | None = None
        self.cors_asked: list[str | None] = []

    def cors(self, request: RequestView) -> dict[str, str]:
        origin = request.headers.get("Origin")
        self.cors_asked.append(origin)
        return {"Access-Control-Allow-Origin": origin} if origin == "http://ok" else {}

    def denied(self, request: RequestView, transport: str = "http") -> Reply | None:
        if request.headers.get("Authorization") != "ok":
            return Reply(401, b"no\n", JSON_HEADERS)
        return None

    def body_too_large(self, request: RequestView) -> Reply:
        return Reply(413, b"big\n", JSON_HEADERS)

    def bad_body(self, request: RequestView) -> Reply:
        return Reply(400, b"late\n", JSON_HEADERS)

    def bad_request(self, request: RequestView, reason: str, status: int) -> Reply:
        self.refused.append(reason)
        return Reply(status, reason.encode(), JSON_HEADERS)

    async def answer(self, request: RequestView, body: bytes, stream: StreamOut) -> Reply | None:
        self.bodies.append(body)
        if self.gate is not None:
            await self.gate.wait()
        if request.headers.get("Accept") == "text/event-stream":
            await stream.write(b"data: 1\n\n")
            await stream.write(b"data: 2\n\n")
            await stream.end()
            return None
        return Reply(200, b"echo:" + body, JSON_HEADERS)


class Delegate(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.made = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def rpc(body: bytes, *, auth: str = "ok", extra: bytes = b"") -> bytes:
    return (
        b"POST /acp/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + auth.encode()
        + b"\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []

    class Sink:
        body = b""

        def on_body(self, b: bytes) -> None:
            self.body += b

        def on_message_complete(self) -> None:
            out.append((parser.get_status_code(), self.body))
            self.body = b""

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(raw)
    return out


class Conn:
    def __init__(self, **limits: Any) -> None:
        self.endpoint = Endpoint()
        self.delegates: list[Delegate] = []

        def fallback() -> Delegate:
            self.delegates.append(Delegate())
            return self.delegates[-1]

        self.front = Front(
            fallback=fallback,
            endpoint=self.endpoint,
            guard=ConnectionGuard(head_timeout=0, max_per_address=0),
            max_body=limits.get("max_body", 1000),
            body_timeout=limits.get("body_timeout", 30.0),
            keepalive_timeout=limits.get("keepalive_timeout", 75.0),
        )
        self.transport = FakeTransport()
        self.proto = self.front()
        self.proto.connection_made(self.transport)

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def feed(self, *reads: bytes) -> list[tuple[int, bytes]]:
        for data in reads:
            self.proto.data_received(data)
        await self.settle()
        return answers(bytes(self.transport.out))


def test_headers_are_case_insensitive_and_first_wins() -> None:
    h = Headers()
    dict.__setitem__(h, "origin", "a")
    assert h.get("Origin") == "a" and "ORIGIN" in h and h.get("Accept", "") == ""
    assert 1 not in h


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=80), min_size=1, max_size=40))
def test_field_keys_are_the_names_in_lower_case(names: list[bytes]) -> None:
    """The cache of field keys holds only what the plain computation gives, and stays
    within its bound however many names a client sends."""
    saved, FIELD_KEYS_BOUND = dict(FIELD_KEYS), front_wire.MAX_FIELD_KEYS
    front_wire.MAX_FIELD_KEYS = 8  # fills and is cleared within one example
    try:
        FIELD_KEYS.clear()
        for name in names:
            key = FIELD_KEYS.get(name) or field_key(name)
            assert key == name.decode("latin-1").lower()
            assert len(FIELD_KEYS) <= 8
            assert all(k == n.decode("latin-1").lower() for n, k in FIELD_KEYS.items())
            assert all(len(n) <= front_wire.FIELD_KEY_BYTES for n in FIELD_KEYS)
    finally:
        front_wire.MAX_FIELD_KEYS = FIELD_KEYS_BOUND
        FIELD_KEYS.clear()
        FIELD_KEYS.update(saved)


async def test_header_names_are_looked_up_in_any_case() -> None:
    c = Conn()
    got = await c.feed(rpc(b"x", extra=b"ACCEPT: text/event-stream\r\n"))
    assert got == [(200, b"data: 1\n\ndata: 2\n\n")]  # Endpoint.answer's SSE branch


def test_the_json_reply_lines_are_those_of_its_headers() -> None:
    """The lines encoded once equal the lines of the constant, which cannot change."""
    lines = "".join(f"{k}: {v}\r\n" for k, v in JSON_HEADERS.items()).encode()
    assert header_lines(JSON_HEADERS, {}) == lines == b"Content-Type: application/json\r\n"
    assert header_lines(dict(JSON_HEADERS), {}) == lines
    with_cors = header_lines(JSON_HEADERS, {"Access-Control-Allow-Origin": "http://ok"})
    assert with_cors.startswith(lines + b"Access-Control-Allow-Origin: http://ok\r\nVary: ")
    with pytest.raises(TypeError):
        JSON_HEADERS["X-Other"] = "1"  # type: ignore[index]


async def test_cors_is_asked_for_a_request_with_an_origin_only() -> None:
    c = Conn()
    got = await c.feed(rpc(b"a"), rpc(b"b", extra=b"origin: http://ok\r\n"), rpc(b"c"))
    assert [status for status, _ in got] == [200, 200, 200]
    assert c.endpoint.cors_asked == ["http://ok"]
    assert bytes(c.transport.out).count(b"Access-Control-Allow-Origin: http://ok\r\n") == 1


@pytest.mark.parametrize("repeated", [0, 1, 60])
async def test_a_head_of_max_headers_field_lines_is_kept_one_more_is_handed_over(
    repeated: int,
) -> None:
    """aiohttp's limit counts field lines, a repeated name's too: rpc() has three,
    and ``repeated`` of the others repeat one name."""
    lines = [b"X-Same: 1\r\n"] * repeated
    lines += [b"X-F%d: 1\r\n" % i for i in range(MAX_HEADERS - 3 - repeated)]
    kept = Conn()
    assert await kept.feed(rpc(b"a", extra=b"".join(lines))) == [(200, b"echo:a")]
    assert not kept.delegates
    over = Conn()
    await over.feed(rpc(b"a", extra=b"".join(lines) + b"X-Last: 1\r\n"))
    assert len(over.delegates) == 1 and over.transport.out == b""


async def test_answers_and_keeps_the_connection() -> None:
    c = Conn()
    got = await c.feed(rpc(b"one"), rpc(b"two"))
    assert got == [(200, b"echo:one"), (200, b"echo:two")]
    assert not c.transport.closed and c.proto in c.front.kept


async def test_pipelined_requests_in_one_read_are_answered_in_order() -> None:
    c = Conn()
    got = await c.feed(b"".join(rpc(b"%d" % i) for i in range(5)))
    assert got == [(200, b"echo:%d" % i) for i in range(5)]


async def test_too_many_pipelined_requests_pause_reading_until_answered() -> None:
    c = Conn()
    c.endpoint.gate = asyncio.Event()
    await c.feed(b"".join(rpc(b"%d" % i) for i in range(MAX_PIPELINED + 2)))
    assert not c.transport.reading
    c.endpoint.gate.set()
    await c.settle()
    assert c.transport.reading
    assert len(answers(bytes(c.transport.out))) == MAX_PIPELINED + 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), max_size=8), st.booleans())
def test_a_handover_gives_aiohttp_every_byte_of_the_first_request(
    cuts: list[int], first: bool
) -> None:
    """However the reads split it, the handler gets the whole request, byte for byte."""

    async def run() -> None:
        c = Conn()
        prefix = b"" if first else rpc(b"kept")
        if not first:
            assert await c.feed(prefix) == [(200, b"echo:kept")]
        request = b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 30 + b"\r\n\r\n"
        reads, rest = [], request
        for n in cuts:
            reads.append(rest[:n])
            rest = rest[n:]
        reads.append(rest)
        await c.feed(*[r for r in reads if r], b"more after")
        (delegate,) = c.delegates
        assert delegate.made and delegate.data == request + b"more after"
        assert c.proto not in c.front.kept
        c.proto.connection_lost(None)
        assert delegate.lost

    asyncio.run(run())


async def test_another_route_pipelined_behind_is_not_answered_and_closes() -> None:
    c = Conn()
    got = await c.feed(rpc(b"a") + b"GET /livez HTTP/1.1\r\n\r\n")
    assert got == [(200, b"echo:a")] and c.transport.closed and not c.delegates
    assert b"Connection: close" in c.transport.out


async def test_refused_requests() -> None:
    c = Conn()
    got = await c.feed(rpc(b"x", auth="bad"), rpc(b"y"))
    assert got == [(401, b"no\n"), (200, b"echo:y")] and c.endpoint.bodies == [b"y"]
    big = Conn()
    assert await big.feed(rpc(b"x" * 1001)) == [(413, b"big\n")]
    assert big.transport.closed and big.endpoint.bodies == []


async def test_a_late_body_is_refused_and_closed() -> None:
    c = Conn(body_timeout=0.01)
    c.proto.data_received(rpc(b"0123456789")[:-5])
    await asyncio.sleep(0.05)
    await c.settle()
    assert answers(bytes(c.transport.out)) == [(400, b"late\n")] and c.transport.closed


async def test_idle_timeout_closes_only_an_idle_connection() -> None:
    c = Conn(keepalive_timeout=0.02)
    c.endpoint.gate = asyncio.Event()
    await c.feed(rpc(b"a"))
    await asyncio.sleep(0.05)
    assert not c.transport.closed  # busy answering
    c.endpoint.gate.set()
    await c.settle()
    await asyncio.sleep(0.05)
    assert c.transport.closed


async def test_sse_answer_is_chunked_and_drains_when_paused() -> None:
    c = Conn()
    c.endpoint.gate = asyncio.Event()
    c.proto.data_received(rpc(b"s", extra=b"Accept: text/event-stream\r\n"))
    await c.settle()
    c.proto.pause_writing()  # once the answer has begun
    c.endpoint.gate.set()
    await c.settle()
    out = bytes(c.transport.out)
    assert b"Transfer-Encoding: chunked" in out and b"data: 1" in out and b"data: 2" not in out
    c.proto.resume_writing()
    await c.settle()
    assert answers(bytes(c.transport.out)) == [(200, b"data: 1\n\ndata: 2\n\n")]


async def test_no_request_is_answered_while_writes_are_paused() -> None:
    c = Conn()
    c.proto.pause_writing()  # the client takes none of the answers written for it
    c.proto.data_received(b"".join(rpc(b"%d" % i) for i in range(MAX_PIPELINED)))
    await c.settle()
    assert not c.endpoint.bodies and not c.transport.out and not c.transport.reading
    c.proto.resume_writing()
    await c.settle()
    assert [a[1] for a in answers(bytes(c.transport.out))] == [
        b"echo:%d" % i for i in range(MAX_PIPELINED)
    ]
    assert c.transport.reading


async def test_a_client_gone_mid_answer_cancels_it() -> None:
    c = Conn()
    c.endpoint.gate = asyncio.Event()
    await c.feed(rpc(b"a"))
    task = c.proto.task
    assert task is not None
    c.proto.connection_lost(None)
    await c.settle()
    assert task.cancelled() and c.proto not in c.front.kept


async def test_shutdown_closes_idle_and_waits_for_busy() -> None:
    idle, busy = Conn(), Conn()
    busy.front = idle.front  # one front, two connections
    busy.proto = idle.front()
    busy.proto.connection_made(busy.transport)
    await idle.feed(rpc(b"i"))
    busy.endpoint = idle.endpoint
    idle.endpoint.gate = asyncio.Event()
    await busy.feed(rpc(b"b"))
    idle.front.pre_shutdown()
    assert idle.transport.closed and not busy.transport.closed
    idle.endpoint.gate.set()
    await asyncio.wait_for(idle.front.shutdown(1.0), 1.0)
    assert answers(bytes(busy.transport.out)) == [(200, b"echo:b")]
    assert b"Connection: close" in busy.transport.out and busy.transport.closed


@pytest.mark.parametrize("raw", [b"\x16\x03\x01garbage", b"GET / HTTP/9.9\r\n\r\n"])
async def test_bad_first_bytes_go_to_aiohttp(raw: bytes) -> None:
    c = Conn()
    await c.feed(raw)
    (delegate,) = c.delegates
    assert delegate.data == raw


async def test_a_last_write_carries_the_terminator() -> None:
    c = Conn()
    writes: list[bytes] = []
    write = c.transport.write

    def spy(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        write(data)

    c.transport.write = spy  # type: ignore[method-assign]
    request = Request(Headers(), "127.0.0.1", c.transport)
    stream = ChunkedStream(c.proto, request)
    await stream.write(b"data: 1\n\n")
    await stream.write(b"data: 2\n\n", last=True)
    await stream.end()  # already ended: nothing more
    assert len(writes) == 2 and writes[1] == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    with pytest.raises(ConnectionResetError):
        await stream.write(b"late")


PIECES = [
    rpc(b"ok"),
    rpc(b"no", auth="bad"),
    rpc(b"x" * 1200),
    b"GET /livez HTTP/1.1\r\n\r\n",
    b"POST /acp/rpc HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAuthorization: ok\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\r\n",
    b"zz\r\n",
    b"POST /acp/rpc HTTP/1.1\r\n",
    b"Content-Length: 3\r\n\r\nabc",
    b"\r\n",
    b"\x00\xff garbage",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=8), st.integers(1, 64))
def test_any_bytes_are_answered_handed_over_or_closed(pieces: list[bytes], size: int) -> None:
    """Whatever arrives, in reads of any size: data_received never raises, what is
    written parses as HTTP answers, and a connection left open is idle or handed over."""

    async def run() -> None:
        c = Conn()
        data = b"".join(pieces)
        for i in range(0, len(data), size):
            c.proto.data_received(data[i : i + size])
        await c.settle()
        out = bytes(c.transport.out)
        got = answers(out)  # raises if the bytes are not well-formed answers
        assert all(status in (200, 400, 401, 413, 431) for status, _ in got)
        if c.delegates:
            assert c.proto not in c.front.kept
        assert c.proto.task is None and not c.proto.queue
        c.proto.connection_lost(None)
        assert c.proto not in c.front.kept

    asyncio.run(run())


async def test_pipelined_bodies_are_bounded_in_bytes_too() -> None:
    """Two requests of 600 KiB queued behind a busy one pause reading (1 MiB bound)."""
    c = Conn(max_body=1 << 20)
    c.endpoint.gate = asyncio.Event()
    big = b"x" * (600 * 1024)
    await c.feed(rpc(b"first"))
    assert c.transport.reading
    await c.feed(rpc(big) + rpc(big))
    assert not c.transport.reading  # 2 of MAX_PIPELINED requests, but 1.2 MiB
    c.endpoint.gate.set()
    await c.settle()
    assert c.transport.reading and len(answers(bytes(c.transport.out))) == 3
