"""internal.bench.clients / loadgen: response parsing and the per-cell tally, no sockets."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from internal.bench.clients import Head, ProtocolError, read_body, read_head
from internal.bench.loadgen import Cell, Outcome, Tally, _body, _check, _summary


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def _read(data: bytes) -> tuple[Head, list[bytes]]:
    reader = _reader(data)
    head = await read_head(reader)
    parts: list[bytes] = []
    await read_body(reader, head, parts.append)
    return head, parts


async def test_content_length_body_is_one_piece() -> None:
    head, parts = await _read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    assert head == Head(200, 5, False, False)
    assert parts == [b"hello"]


async def test_chunked_body_is_handed_over_chunk_by_chunk() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'6\r\ndata: \r\na;ext=1\r\n{"a": 1}\n\n\r\n0\r\n\r\n'
    )
    head, parts = await _read(data)
    assert head == Head(200, -1, True, True)
    assert parts == [b"data: ", b'{"a": 1}\n\n']


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\n\r\n",  # neither length nor chunked
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",  # no CRLF
    ],
)
async def test_malformed_responses_raise(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        await _read(data)


async def test_a_truncated_body_raises() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await _read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")


def test_bodies_of_each_kind() -> None:
    caps = orjson.loads(_body("ws_caps", 3, "s"))
    assert caps == {"jsonrpc": "2.0", "id": 3, "method": "acp.capabilities"}
    turn = orjson.loads(_body("stream", 4, "w1", "long prompt"))
    assert turn["method"] == "session.message"
    assert turn["params"]["taskPrompt"] == "long prompt"
    assert turn["params"]["sessionId"] == turn["params"]["threadId"] == "w1"


def test_check_accepts_only_the_expected_success() -> None:
    ok = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"success": True}})
    failed = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"success": False}})
    assert _check("turn", 200, ok) == ""
    assert _check("turn", 200, failed).startswith("turn failed")
    assert _check("caps", 200, failed) == ""  # capabilities: any result object
    assert _check("ws_caps", 401, b"").startswith("HTTP 401")
    assert _check("caps", 200, b'{"error": {}}').startswith("no result")


def test_tally_counts_only_successes_in_the_timings() -> None:
    tally = Tally()
    tally.add(Outcome(0.030, "", first_event=0.005, first_delta=0.025, notifications=51, deltas=50))
    tally.add(Outcome(0.040, "", first_event=0.006, first_delta=0.027, notifications=51, deltas=50))
    tally.add(Outcome(0.500, "49 delta notifications, expected 50", notifications=50, deltas=49))
    cell = Cell(url="http://x/acp/rpc", kind="stream", pids=(1,))
    cpu = {"start": {1: 1.0}, "end": {1: 1.5}}
    out = _summary(cell, tally, 2.0, 0, cpu, {})
    assert out["completed"] == 2 and out["errors"] == 1
    assert out["first_error"] == "49 delta notifications, expected 50"
    assert out["per_s"] == 1.0
    assert (out["notifications"], out["deltas"]) == (102, 100)
    assert out["first_chunk_p50_ms"] == pytest.approx(25.0)
    assert out["first_event_p50_ms"] == pytest.approx(5.0)
    assert out["cpu_s"] == {"1": 0.5}
