"""The ``/acp/rpc`` front (transport/front.py) against the in-process daemon, with raw
sockets on 127.0.0.1: which connections it keeps and which it hands to aiohttp,
keep-alive and pipelining, its limits, SSE framing, and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path
from typing import Any

import httptools
import orjson

from tests.conftest import (
    TOKEN,
    FakeUpstream,
    StartBridge,
    log_entries,
    providers_config,
    session_params,
    wait_until,
)

WAIT = 5.0
CAPS = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})


def post(
    body: bytes = CAPS, *, extra: str = "", auth: bool = True, path: str = "/acp/rpc"
) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if auth:
        head += f"Authorization: Bearer {TOKEN}\r\n"
    head += extra + f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode()


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.chunked_body: list[bytes] = []

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def json(self) -> Any:
        return orjson.loads(self.body)


class Client:
    """A raw HTTP/1.1 connection that reads answers one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.done: list[Answer] = []
        self._current = Answer()
        self.parser = httptools.HttpResponseParser(self)

    @classmethod
    async def open(cls, port: int) -> Client:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
        return cls(reader, writer)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._current.headers.append((name.decode(), value.decode()))

    def on_headers_complete(self) -> None:
        self._current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._current.body += body
        self._current.chunked_body.append(body)

    def on_message_complete(self) -> None:
        self.done.append(self._current)
        self._current = Answer()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> Answer:
        async with asyncio.timeout(WAIT):
            while not self.done:
                data = await self.reader.read(65536)
                assert data, "the server closed the connection before answering"
                self.parser.feed_data(data)
        return self.done.pop(0)

    async def closed(self) -> bool:
        """True once the server closes the connection (fails after WAIT)."""
        async with asyncio.timeout(WAIT):
            with contextlib.suppress(ConnectionResetError):
                while data := await self.reader.read(65536):
                    self.parser.feed_data(data)
        return True

    def close(self) -> None:
        self.writer.close()


async def kept(bridge: Any) -> int:
    front = bridge.server.front
    assert front is not None
    return len(front.kept)


async def test_rpc_then_other_routes_on_one_kept_alive_connection(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    for _ in range(3):  # the front answers, keep-alive
        await client.send(post())
        answer = await client.answer()
        assert answer.status == 200 and answer.header("Content-Type") == "application/json"
        assert answer.json()["result"]["capabilities"]
        assert answer.header("Connection") is None and answer.header("Date")
    assert await kept(bridge) == 1
    await client.send(get("/livez"))  # another route: handed to aiohttp, same connection
    answer = await client.answer()
    assert answer.status == 200 and b"ok" in answer.body
    assert await kept(bridge) == 0
    await client.send(post())  # aiohttp answers /acp/rpc as well from then on
    answer = await client.answer()
    assert answer.status == 200 and answer.json()["id"] == 1
    client.close()


async def test_a_connection_that_starts_elsewhere_goes_to_aiohttp(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    await client.send(get("/readyz"))
    assert (await client.answer()).status in (200, 503)
    assert await kept(bridge) == 0
    await client.send(post())
    assert (await client.answer()).json()["result"]["capabilities"]
    # and a request split across reads, head byte by byte
    other = await Client.open(bridge.port)
    for byte in post():
        await other.send(bytes([byte]))
    assert (await other.answer()).json()["id"] == 1
    client.close()
    other.close()


async def test_pipelined_rpc_requests_are_answered_in_order(start_bridge: StartBridge) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    bodies = [
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "acp.capabilities"}) for i in range(5)
    ]
    await client.send(b"".join(post(b) for b in bodies))
    ids = [(await client.answer()).json()["id"] for _ in bodies]
    assert ids == [0, 1, 2, 3, 4]
    client.close()


async def test_a_pipelining_client_that_reads_no_answers_is_not_answered_on(
    start_bridge: StartBridge,
) -> None:
    """Plain answers were written without waiting for a paused transport: a client
    that pipelined requests and read none of the answers had every one of them
    answered into the connection's buffer (28 MB for 3.7 MB of requests), up to the
    send deadline. Now no request is answered while writes are paused: the queue
    fills, reading pauses, and the client's requests wait in its own socket."""
    bridge = await start_bridge()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # it takes little
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", bridge.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    client = Client(reader, writer)
    await client.send(post())
    assert (await client.answer()).json()["id"] == 1
    conn = next(iter(bridge.server.front.kept))
    bodies = [
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "acp.capabilities"})
        for i in range(6000)  # about 8 MB of answers
    ]
    sending = asyncio.create_task(client.send(b"".join(post(b) for b in bodies)))
    buffered = conn.transport.get_write_buffer_size
    await wait_until(
        lambda: (
            (conn.paused and conn._reading_paused and conn._drained is not None)
            or buffered() > 4 * 1024 * 1024
        )
    )
    assert buffered() < 1024 * 1024
    ids = [(await client.answer()).json()["id"] for _ in bodies]  # then it reads them all
    await sending
    assert ids == list(range(6000))
    client.close()


async def test_another_route_pipelined_behind_rpc_closes_after_the_rpc_answer(
    start_bridge: StartBridge,
) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    await client.send(post() + get("/livez"))
    answer = await client.answer()
    assert answer.status == 200 and answer.json()["id"] == 1
    assert await client.closed()  # the GET is not answered: the client retries it
    assert not client.done


async def test_refusals_keep_or_close_the_connection(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    bridge = await start_bridge(config={"limits": {"max_body_bytes": 1000}}, tmp=tmp_path)
    client = await Client.open(bridge.port)
    await client.send(post(auth=False))  # 401, body read and dropped, connection kept
    answer = await client.answer()
    assert answer.status == 401 and answer.json()["error"]["code"] == -32001
    await client.send(post(extra="Origin: https://evil.example\r\n"))
    answer = await client.answer()
    assert answer.status == 403
    await client.send(post(b"{not json"))
    assert (await client.answer()).status == 400
    await client.send(post())
    assert (await client.answer()).status == 200
    # too large by Content-Length: 413 at once, then closed
    await client.send(post(b"x" * 1001))
    answer = await client.answer()
    assert answer.status == 413 and "1000 bytes" in answer.json()["error"]["message"]
    assert answer.header("Connection") == "close"
    assert await client.closed()
    # too large as a chunked body
    chunked = await Client.open(bridge.port)
    head = post(b"")[: -len(b"Content-Length: 0\r\n\r\n")]
    await chunked.send(
        head + b"Transfer-Encoding: chunked\r\n\r\n" + b"200\r\n" + b"x" * 512 + b"\r\n"
    )
    await chunked.send(b"400\r\n" + b"x" * 1024 + b"\r\n")
    assert (await chunked.answer()).status == 413
    assert await chunked.closed()


async def test_bad_bytes(start_bridge: StartBridge) -> None:
    bridge = await start_bridge()
    first = await Client.open(bridge.port)  # the first bytes: aiohttp's own 400
    await first.send(b"NOT HTTP AT ALL\r\n\r\n")
    assert (await first.answer()).status == 400
    later = await Client.open(bridge.port)  # a new read after a kept request: aiohttp's too
    await later.send(post())
    assert (await later.answer()).status == 200
    await later.send(b"POST /acp/rpc HTTP/1.1\r\nContent-Length: zz\r\n\r\n")
    assert (await later.answer()).status == 400
    assert await kept(bridge) == 0
    piped = await Client.open(bridge.port)  # pipelined behind a kept request: 400 here
    await piped.send(post() + b"POST /acp/rpc HTTP/1.1\r\nContent-Length: zz\r\n\r\n")
    assert (await piped.answer()).status == 200
    answer = await piped.answer()
    assert answer.status == 400 and answer.header("Connection") == "close"
    assert await piped.closed()
    huge = await Client.open(bridge.port)  # a head over 64 KiB pipelined: 431 here
    await huge.send(post() + b"POST /acp/rpc HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
    assert (await huge.answer()).status == 200
    assert (await huge.answer()).status == 431
    assert await huge.closed()
    rejected = [e for e in log_entries(bridge.logs) if e.get("msg") == "request rejected"]
    reasons = {(e["reason"], e.get("status")) for e in rejected}
    assert {("bad_request", 400), ("head_too_large", 431)} <= reasons


async def test_expect_and_http_1_0_go_to_aiohttp(start_bridge: StartBridge) -> None:
    bridge = await start_bridge()
    client = await Client.open(bridge.port)
    await client.send(post(extra="Expect: 100-continue\r\n"))
    answers = [await client.answer()]
    if answers[0].status == 100:
        answers.append(await client.answer())
    assert answers[-1].status == 200 and answers[-1].json()["id"] == 1
    assert await kept(bridge) == 0
    old = await Client.open(bridge.port)
    await old.send(post().replace(b"HTTP/1.1", b"HTTP/1.0", 1))
    assert (await old.answer()).json()["id"] == 1
    client.close()


async def test_sse_answer_is_chunked_with_cors_headers(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = providers_config(
        {"id": "codex", "endpoint": fake_upstream.url},
        allowed_origins=["https://app.example"],
    )
    bridge = await start_bridge(config=config, tmp=tmp_path)
    client = await Client.open(bridge.port)
    body = orjson.dumps(
        {"jsonrpc": "2.0", "id": 7, "method": "session.start", "params": session_params("fr")}
    )
    extra = "Accept: text/event-stream\r\nOrigin: https://app.example\r\n"
    await client.send(post(body, extra=extra))
    answer = await client.answer()
    assert answer.status == 200
    assert answer.header("Content-Type") == "text/event-stream"
    assert answer.header("Transfer-Encoding") == "chunked"
    assert answer.header("Access-Control-Allow-Origin") == "https://app.example"
    assert [v for k, v in answer.headers if k == "Vary"] == [
        "Origin",
        "Access-Control-Request-Method",
        "Access-Control-Request-Headers",
    ]
    events = [e for e in answer.body.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events)
    final = orjson.loads(events[-1][6:])
    assert final["id"] == 7 and final["result"]["output"] == "echo: hello"
    await client.send(post())  # still kept alive after the stream
    assert (await client.answer()).json()["id"] == 1
    assert await kept(bridge) == 1
    client.close()


async def test_idle_kept_connections_close_after_the_keepalive_timeout(
    start_bridge: StartBridge, tmp_path: Path
) -> None:
    bridge = await start_bridge(config={"limits": {"keepalive_timeout": 0.3}}, tmp=tmp_path)
    client = await Client.open(bridge.port)
    await client.send(post())
    assert (await client.answer()).status == 200
    await client.send(b"POST /acp/rpc HTTP/1.1\r\nHost: x\r\n")  # part of a head, then nothing
    assert await client.closed()
    assert await kept(bridge) == 0


async def answering(bridge: Any, session_id: str, prompt: str) -> tuple[Client, asyncio.Task[None]]:
    """A kept connection whose ``session.start`` turn is being answered now, and the
    connection's task."""
    client = await Client.open(bridge.port)
    params = session_params(session_id, prompt)
    body = {"jsonrpc": "2.0", "id": 9, "method": "session.start", "params": params}
    await client.send(post(orjson.dumps(body)))
    front = bridge.server.front
    await wait_until(lambda: any(c.task is not None for c in front.kept))
    task = next(c.task for c in front.kept if c.task is not None)
    assert task is not None
    return client, task


async def test_shutdown_closes_idle_kept_connections_and_finishes_busy_ones(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = providers_config({"id": "codex", "endpoint": fake_upstream.url})
    bridge = await start_bridge(config=config, tmp=tmp_path)
    idle = await Client.open(bridge.port)
    await idle.send(post())
    assert (await idle.answer()).status == 200
    busy, _ = await answering(bridge, "sd", "slow:400 bye")
    stopping = asyncio.create_task(bridge.stop())
    assert await idle.closed()
    answer = await busy.answer()  # the running turn is drained and answered
    assert answer.json()["result"]["output"] == "echo: bye"
    assert answer.header("Connection") == "close"
    assert await busy.closed()
    await asyncio.wait_for(stopping, WAIT)


async def test_a_client_that_goes_away_abandons_its_request(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = providers_config({"id": "codex", "endpoint": fake_upstream.url})
    bridge = await start_bridge(config=config, tmp=tmp_path)
    client, task = await answering(bridge, "gone", "slow:5000 x")
    client.close()
    await asyncio.wait_for(asyncio.wait([task]), WAIT)  # cancelled, not left to run 5 s
    assert task.cancelled()
    assert await kept(bridge) == 0
