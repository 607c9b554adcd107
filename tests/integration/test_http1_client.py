"""xwm_bridge.providers.http1 against scripted raw HTTP servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from tests.conftest import wait_until
from xwm_bridge.providers.http1 import Http1Error, Target
from xwm_bridge.providers.http1_pool import Http1Pool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    script: Script
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    server: asyncio.Server | None = None

    async def wait_requests(self, n: int) -> None:
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.requests) >= n), 5)

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        async with self.arrived:
            self.arrived.notify_all()
        return body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer, self)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.disconnected.set()
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(script: Script) -> Server:
        srv = Server(script)
        srv.server = await asyncio.start_server(srv._serve, "127.0.0.1", 0)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        assert srv.server is not None
        srv.server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(srv.server.wait_closed(), 2)


def ok(body: bytes, *extra: bytes) -> bytes:
    head = [
        b"HTTP/1.1 200 OK",
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
    ]
    return b"\r\n".join([*head, *extra]) + b"\r\n\r\n" + body


async def echo_forever(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
    while True:
        body = await s.read_request(r)
        w.write(ok(body))
        await w.drain()


def target(srv: Server) -> tuple[Target, bytes]:
    t = Target.parse(f"http://127.0.0.1:{srv.port}/acp/rpc")
    return t, t.head({"Content-Type": "application/json", "Accept": "application/json"})


async def post(pool: Http1Pool, srv: Server, body: bytes, read_timeout: float = 5) -> bytes:
    t, head = target(srv)
    resp = await pool.post(t, head, body, connect_timeout=2, read_timeout=read_timeout)
    assert resp.status == 200
    return await resp.read(1 << 20)


async def test_request_bytes_and_keep_alive_reuse(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    srv = await serve(echo_forever)
    pool = Http1Pool()
    assert await post(pool, srv, b'{"a":1}') == b'{"a":1}'
    assert await post(pool, srv, b'{"b":2}') == b'{"b":2}'
    assert srv.connections == 1  # the second call reused the warm connection
    assert pool.idle_count() == 1
    first = srv.requests[0]
    assert first.startswith(b"POST /acp/rpc HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % srv.port)
    assert b"\r\nContent-Length: 7\r\n\r\n" in first and first.endswith(b'{"a":1}')
    await pool.close()


async def test_concurrent_calls_use_separate_connections(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    gate = asyncio.Event()

    async def slow(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        body = await s.read_request(r)
        await gate.wait()
        w.write(ok(body))
        await w.drain()

    srv = await serve(slow)
    pool = Http1Pool()
    calls = [asyncio.create_task(post(pool, srv, b"%d" % i)) for i in range(3)]
    await srv.wait_requests(3)
    assert srv.connections == 3
    gate.set()
    assert sorted(await asyncio.gather(*calls)) == [b"0", b"1", b"2"]
    await pool.close()


async def test_chunked_body_is_streamed_in_order(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def chunked(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
        w.write(b"Transfer-Encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"):
            w.write(b"%x\r\n%s\r\n" % (len(part), part))
            await w.drain()
            await asyncio.sleep(0.01)  # separate chunks on the wire, as a streaming peer sends
        w.write(b"0\r\n\r\n")
        await w.drain()
        await s.read_request(r)  # keep-alive: a second request on the same connection
        w.write(ok(b"again"))
        await w.drain()

    srv = await serve(chunked)
    pool = Http1Pool()
    t, head = target(srv)
    resp = await pool.post(t, head, b"{}", connect_timeout=2, read_timeout=5)
    assert resp.content_type == "text/event-stream"
    got = b"".join([chunk async for chunk in resp.stream()])
    assert got == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    assert await post(pool, srv, b"{}") == b"again"
    assert srv.connections == 1
    await pool.close()


async def test_body_until_close_without_length(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def until_close(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n\r\n")
        w.write(b'{"partial":')
        await w.drain()
        w.write(b'"no"}')
        await w.drain()
        w.close()

    srv = await serve(until_close)
    pool = Http1Pool()
    assert await post(pool, srv, b"{}") == b'{"partial":"no"}'
    assert pool.idle_count() == 0  # Connection: close is never pooled
    await pool.close()


async def test_read_timeout_is_the_longest_silence(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def trickle(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        for byte in (b"a", b"b"):  # each gap is below the read timeout: no timeout
            await asyncio.sleep(0.15)
            w.write(byte)
            await w.drain()
        await r.read(1)  # then silence, until the client goes away

    srv = await serve(trickle)
    pool = Http1Pool()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(Http1Error) as err:
        await post(pool, srv, b"{}", read_timeout=0.3)
    elapsed = loop.time() - began
    assert err.value.kind == "timeout" and "read timeout" in str(err.value)
    assert 0.55 <= elapsed < 2.0
    await asyncio.wait_for(srv.disconnected.wait(), 2)  # the connection was closed
    await pool.close()


async def test_a_kept_connection_arms_one_read_timer_for_all_its_waits(
    serve: Callable[[Script], Awaitable[Server]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read deadline's timer outlives a wait (performance: about 2 µs to arm and
    cancel one on uvloop, two waits per turn): five exchanges, one timer."""
    loop = asyncio.get_running_loop()
    armed: list[object] = []
    call_at = loop.call_at

    def counting(when: float, callback: Callable[..., object], *args: object) -> object:
        if getattr(callback, "__qualname__", "").startswith("Connection."):
            armed.append(callback)
        return call_at(when, callback, *args)

    monkeypatch.setattr(loop, "call_at", counting)
    srv = await serve(echo_forever)
    pool = Http1Pool()
    for i in range(5):
        assert await post(pool, srv, b"%d" % i) == b"%d" % i
    assert srv.connections == 1
    assert len(armed) == 1
    await pool.close()


async def test_a_shorter_read_timeout_than_the_armed_timer_still_holds(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    """A connection's timer armed for a long read timeout is re-armed for a later
    exchange's shorter one (a provider's cancel shares the pool with its turns)."""

    async def answer_then_silence(
        r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server
    ) -> None:
        body = await s.read_request(r)
        w.write(ok(body))
        await w.drain()
        await s.read_request(r)
        await r.read(1)  # no answer, until the client goes away

    srv = await serve(answer_then_silence)
    pool = Http1Pool()
    assert await post(pool, srv, b"{}", read_timeout=60) == b"{}"
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(Http1Error) as err:
        await post(pool, srv, b"{}", read_timeout=0.2)
    assert err.value.kind == "timeout" and "0.2s" in str(err.value)
    # uvloop's clock moves in whole milliseconds: 200 ms between two readings can come
    # out as 0.19999… in floating point, so the bound allows for that rounding only
    assert 0.2 - 1e-9 <= loop.time() - began < 2.0
    assert srv.connections == 1  # the same connection: its timer was the long one
    await pool.close()


async def test_connect_refused() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = Http1Pool()
    t = Target.parse(f"http://127.0.0.1:{port}/acp/rpc")
    with pytest.raises(Http1Error) as err:
        await pool.post(t, t.head({}), b"{}", connect_timeout=2, read_timeout=2)
    assert err.value.kind == "connect" and f"127.0.0.1:{port}" in str(err.value)


async def test_idle_connection_closed_by_the_server_is_retried_fresh(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    served: list[int] = []

    async def one_per_connection(
        r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server
    ) -> None:
        body = await s.read_request(r)
        served.append(s.connections)
        w.write(ok(body))  # keep-alive advertised ...
        await w.drain()
        # ... but the server closes as soon as the next request arrives, unanswered
        await r.read(1)

    srv = await serve(one_per_connection)
    pool = Http1Pool()
    assert await post(pool, srv, b"1") == b"1"
    assert await post(pool, srv, b"2") == b"2"  # the reused socket died unanswered: retried
    assert srv.connections == 2 and served == [1, 2]
    await pool.close()


async def test_a_connection_that_dies_mid_answer_is_an_error_not_a_retry(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def half(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await w.drain()

    srv = await serve(half)
    pool = Http1Pool()
    with pytest.raises(Http1Error) as err:
        await post(pool, srv, b"{}")
    assert err.value.kind == "transport" and srv.connections == 1
    await pool.close()


@pytest.mark.parametrize("chunked", [False, True])
async def test_body_over_the_cap(
    serve: Callable[[Script], Awaitable[Server]], chunked: bool
) -> None:
    async def big(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        if chunked:
            w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(20):
                w.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
                await w.drain()
            w.write(b"0\r\n\r\n")
        else:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 20480\r\n\r\n" + b"x" * 20480)
        await w.drain()
        await r.read(1)  # the connection stays open until the client leaves

    srv = await serve(big)
    pool = Http1Pool()
    t, head = target(srv)
    resp = await pool.post(t, head, b"{}", connect_timeout=2, read_timeout=5)
    with pytest.raises(Http1Error, match="too large"):
        await resp.read(10_000)
    assert pool.idle_count() == 0
    await asyncio.wait_for(srv.disconnected.wait(), 2)  # the client closed it
    await pool.close()


async def test_cancel_mid_answer_closes_the_connection(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def hang(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        await r.read(1)  # returns b"" when the client goes away

    srv = await serve(hang)
    pool = Http1Pool()
    call = asyncio.create_task(post(pool, srv, b"{}"))
    await srv.wait_requests(1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(srv.disconnected.wait(), 2)  # the upstream saw us leave
    assert pool.idle_count() == 0
    await pool.close()


async def test_not_http_is_a_protocol_error(serve: Callable[[Script], Awaitable[Server]]) -> None:
    async def garbage(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await w.drain()
        await r.read(1)  # the connection stays open until the client leaves

    srv = await serve(garbage)
    with pytest.raises(Http1Error) as err:
        await post(Http1Pool(), srv, b"{}")
    assert err.value.kind == "protocol"
    await asyncio.wait_for(srv.disconnected.wait(), 2)  # the client closed it


async def test_connection_limit_queues_the_next_call(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    srv = await serve(echo_forever)
    pool = Http1Pool(max_connections=1)
    t, head = target(srv)
    first = await pool.post(t, head, b"1", connect_timeout=2, read_timeout=5)
    second = asyncio.create_task(pool.post(t, head, b"2", connect_timeout=2, read_timeout=5))
    await asyncio.sleep(0)  # the second call runs up to the slot it waits for
    assert not second.done() and len(srv.requests) == 1  # it waits for the one slot
    assert await first.read(100) == b"1"
    resp = await asyncio.wait_for(second, 2)
    assert await resp.read(100) == b"2"
    assert srv.connections == 1
    await pool.close()


def test_header_values_with_line_breaks_are_refused() -> None:
    t = Target.parse("https://example.test/acp/rpc")
    assert t.tls and t.port == 443
    assert t.head({"A": "b"}).startswith(
        b"POST /acp/rpc HTTP/1.1\r\nHost: example.test\r\nA: b\r\n"
    )
    with pytest.raises(ValueError):
        t.head({"Authorization": "Bearer x\r\nX-Evil: 1"})
    with pytest.raises(ValueError):
        Target.parse("ftp://example.test/")


def _sse_head(w: asyncio.StreamWriter) -> None:
    w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
    w.write(b"Transfer-Encoding: chunked\r\n\r\n")


async def test_release_before_the_end_pools_the_connection_when_the_end_arrives(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    # an SSE reader stops at the response event; the chunked terminator comes in a
    # later write: the connection is still reused once it has arrived
    gate = asyncio.Event()

    async def late_end(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        _sse_head(w)
        w.write(b"9\r\ndata: 1\n\n\r\n")
        await w.drain()
        await gate.wait()
        w.write(b"0\r\n\r\n")
        await w.drain()
        await s.read_request(r)
        w.write(ok(b"again"))
        await w.drain()

    srv = await serve(late_end)
    pool = Http1Pool()
    t, head = target(srv)
    resp = await pool.post(t, head, b"{}", connect_timeout=2, read_timeout=5)
    stream = resp.stream()
    assert await anext(stream) == b"data: 1\n\n"
    await stream.aclose()
    resp.release()
    assert pool.idle_count() == 0  # not yet: the body has not ended
    gate.set()
    await wait_until(lambda: pool.idle_count() == 1)
    assert await post(pool, srv, b"{}") == b"again"
    assert srv.connections == 1
    await pool.close()


async def test_release_of_an_answer_that_never_ends_closes_it_after_the_drain_deadline(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def endless(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        _sse_head(w)
        w.write(b"9\r\ndata: 1\n\n\r\n")
        await w.drain()
        await r.read()  # until the client leaves

    srv = await serve(endless)
    pool = Http1Pool(drain_timeout=0.05)
    t, head = target(srv)
    resp = await pool.post(t, head, b"{}", connect_timeout=2, read_timeout=5)
    async for _chunk in resp.stream():
        break
    resp.release()
    async with asyncio.timeout(5):
        await srv.disconnected.wait()  # closed by the drain deadline, never pooled
    assert pool.idle_count() == 0
    await pool.close()


async def test_release_discards_at_most_the_drain_cap(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    async def flood(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        _sse_head(w)
        w.write(b"9\r\ndata: 1\n\n\r\n")
        await w.drain()
        part = b"x" * 4096
        with contextlib.suppress(ConnectionError):
            for _ in range(64):
                w.write(b"%x\r\n%s\r\n" % (len(part), part))
                await w.drain()
        await r.read()

    srv = await serve(flood)
    pool = Http1Pool(drain_timeout=30, drain_cap=16 * 1024)
    t, head = target(srv)
    resp = await pool.post(t, head, b"{}", connect_timeout=2, read_timeout=5)
    async for _chunk in resp.stream():
        break
    resp.release()
    async with asyncio.timeout(5):
        await srv.disconnected.wait()  # too much left to read: closed, not drained
    assert pool.idle_count() == 0
    await pool.close()


async def test_streamed_upstream_turns_reuse_one_connection(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    # like aiohttp's StreamResponse: the response event, then write_eof's terminator
    # in a separate write, after the client may already have read the response
    from xwm_bridge.config import ProviderConfig
    from xwm_bridge.endpoint import derive_endpoint
    from xwm_bridge.providers.upstream import UpstreamClient

    async def sse_turns(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        while True:
            await s.read_request(r)
            _sse_head(w)
            for data in (
                b'data: {"jsonrpc":"2.0","method":"session.update","params":{"delta":"hi"}}\n\n',
                b'data: {"jsonrpc":"2.0","id":"req-1","result":{"success":true}}\n\n',
            ):
                w.write(b"%x\r\n%s\r\n" % (len(data), data))
                await w.drain()
                await asyncio.sleep(0.005)
            w.write(b"0\r\n\r\n")
            await w.drain()

    srv = await serve(sse_turns)
    pool = Http1Pool()
    client = UpstreamClient(pool)
    provider = ProviderConfig(id="p", endpoint=f"http://127.0.0.1:{srv.port}/acp/rpc")
    endpoint = derive_endpoint(provider.endpoint)
    notes: list[dict[str, object]] = []

    async def on_note(message: dict[str, object]) -> None:
        notes.append(message)

    for _ in range(3):
        reply = await client.call(provider, endpoint, "", "session.message", {}, on_note)
        assert reply["result"] == {"success": True}
        # the terminator follows the response event: pooled once it has arrived
        await wait_until(lambda: pool.idle_count() == 1)
    assert len(notes) == 3
    assert srv.connections == 1  # each turn's connection went back to the pool
    await pool.close()


@pytest.mark.parametrize(
    "codings",
    [
        [b"gzip, chunked"],
        [b"deflate,chunked"],
        [b"gzip", b"chunked"],  # two field lines: one list (RFC 9110 §5.3)
        [b"gzip"],  # chunked not final: would be read to the close, still gzip
        [b"identity"],
    ],
)
async def test_an_answer_in_a_coding_other_than_chunked_is_a_protocol_error(
    serve: Callable[[Script], Awaitable[Server]], codings: list[bytes]
) -> None:
    """Such a body was passed on undecoded (gzip bytes read as JSON)."""
    import gzip

    body = gzip.compress(b'{"jsonrpc":"2.0","id":1,"result":{}}')

    async def coded(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        lines = b"".join(b"Transfer-Encoding: %b\r\n" % c for c in codings)
        w.write(b"HTTP/1.1 200 OK\r\n" + lines + b"\r\n")
        w.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        await w.drain()
        w.close()

    srv = await serve(coded)
    pool = Http1Pool()
    with pytest.raises(Http1Error, match="Transfer-Encoding") as err:
        await post(pool, srv, b"{}")
    assert err.value.kind == "protocol"
    assert pool.idle_count() == 0
    await pool.close()


async def test_a_length_with_many_leading_zeros_is_read_as_its_number(
    serve: Callable[[Script], Awaitable[Server]],
) -> None:
    """``int`` refuses more than 4300 digits: reading such an answer raised ValueError."""
    body = b'{"a":1}'

    async def zeros(r: asyncio.StreamReader, w: asyncio.StreamWriter, s: Server) -> None:
        await s.read_request(r)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %b%d\r\n\r\n" % (b"0" * 5000, len(body)))
        w.write(body)
        await w.drain()
        await r.read(1)

    srv = await serve(zeros)
    pool = Http1Pool()
    assert await post(pool, srv, b"{}") == body
    await pool.close()
