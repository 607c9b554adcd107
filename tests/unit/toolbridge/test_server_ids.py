"""The toolbridge stdio loop in-process: request ids (MCP: a request id MUST NOT have
been used before in the session; each response carries its request's id exactly)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from xwm_bridge import jsonrpc
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge import protocol
from xwm_bridge.toolbridge import server as server_module
from xwm_bridge.toolbridge.server import ToolbridgeServer

INIT_0326 = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}\n'
)
ID_IN_USE = {"code": -32600, "message": "invalid request: request id already in use"}


def review(rid: Any, prompt: str) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": rid,
            "method": "tools/call",
            "params": {"name": "claude_review", "arguments": {"prompt": prompt}},
        }
    )


def cancel(rid: Any) -> str:
    return json.dumps(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": rid}}
    )


class Reviews:
    """A fake ``claude_review``: a prompt in ``held`` waits for ``gate`` (or its
    cancellation), any other prompt answers at once."""

    def __init__(self, held: set[str]) -> None:
        self.held = held
        self.gate = asyncio.Event()
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.changed = asyncio.Event()

    async def __call__(self, _cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
        prompt: str = args["prompt"]
        self.started.append(prompt)
        self.changed.set()
        if prompt in self.held:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append(prompt)
                self.changed.set()
                raise
        return "reviewed " + prompt

    async def until(self, predicate: Any) -> None:
        while not predicate():
            self.changed.clear()
            await self.changed.wait()


async def run(
    script: list[tuple[Any, bytes]],
    out: list[Any],
    changed: asyncio.Event,
    hold: Callable[[Any], Awaitable[None]] | None = None,
) -> None:
    """Serve ``script`` (a coroutine function to await before each read, or None, and
    the chunk read): every reply goes to ``out`` and sets ``changed``, then the write
    awaits ``hold(reply)`` when given; end of input after the script."""

    async def read() -> bytes:
        if not script:
            return b""
        before, chunk = script.pop(0)
        if before is not None:
            await before()
        return chunk

    async def write(data: bytes) -> None:
        out.append(orjson.loads(data))
        changed.set()
        if hold is not None:
            await hold(out[-1])

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
        assert server._inflight == {}


async def test_a_duplicate_in_flight_id_is_refused_and_the_first_call_keeps_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second request with the id of a running one is answered ``-32600 request id
    already in use`` and never run; the first call still gets its own answer. (The
    duplicate replaced the first call's in-flight entry and both ran, each answered
    under the same id.)"""
    reviews = Reviews(held={"first"})
    monkeypatch.setattr(server_module, "claude_review", reviews)
    out: list[Any] = []

    async def refused_or_both_started() -> None:
        await reviews.until(lambda: out or len(reviews.started) == 2)
        reviews.gate.set()

    script = [
        (None, f"{review(1, 'first')}\n{review(1, 'second')}\n".encode()),
        (refused_or_both_started, b""),
    ]
    await run(script, out, reviews.changed)
    assert out == [
        {"jsonrpc": "2.0", "id": 1, "error": ID_IN_USE},
        {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {"content": [{"type": "text", "text": "reviewed first"}]},
        },
    ]
    assert reviews.started == ["first"]


async def test_a_cancel_after_a_refused_duplicate_reaches_the_running_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``notifications/cancelled`` for an id that a duplicate tried to take cancels the
    call running under it, and nothing is answered for that call. (The cancel went to
    the duplicate, and the first call answered.)"""
    reviews = Reviews(held={"first", "second"})
    monkeypatch.setattr(server_module, "claude_review", reviews)
    out: list[Any] = []

    async def refused_or_both_started() -> None:
        await reviews.until(lambda: (out and reviews.started) or len(reviews.started) == 2)

    async def one_cancelled() -> None:
        await reviews.until(lambda: reviews.cancelled)
        reviews.gate.set()  # whatever was not cancelled answers now

    script = [
        (None, f"{review(1, 'first')}\n{review(1, 'second')}\n".encode()),
        (refused_or_both_started, f"{cancel(1)}\n".encode()),
        (one_cancelled, b""),
    ]
    await run(script, out, reviews.changed)
    assert out == [{"jsonrpc": "2.0", "id": 1, "error": ID_IN_USE}]
    assert reviews.started == reviews.cancelled == ["first"]


async def test_duplicate_ids_in_a_batch_are_refused_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a served batch an element reusing the id of a running call, or of an earlier
    element, is its own ``-32600`` in the batch's array, and never runs."""
    reviews = Reviews(held={"running"})
    monkeypatch.setattr(server_module, "claude_review", reviews)
    out: list[Any] = []

    async def running() -> None:
        await reviews.until(lambda: "running" in reviews.started)

    async def batch_answered() -> None:
        await reviews.until(lambda: any(isinstance(reply, list) for reply in out))
        reviews.gate.set()

    batch = ",".join([review(1, "again"), review(5, "five"), review(5, "five again")])
    script = [
        (None, INIT_0326 + f"{review(1, 'running')}\n".encode()),
        (running, f"[{batch}]\n".encode()),
        (batch_answered, b""),
    ]
    await run(script, out, reviews.changed)
    assert out[0]["id"] == 0
    assert out[1] == [
        {"jsonrpc": "2.0", "id": 1, "error": ID_IN_USE},
        {
            "jsonrpc": "2.0",
            "id": 5,
            "result": {"content": [{"type": "text", "text": "reviewed five"}]},
        },
        {"jsonrpc": "2.0", "id": 5, "error": ID_IN_USE},
    ]
    assert out[2]["id"] == 1
    assert out[2]["result"]["content"][0]["text"] == "reviewed running"
    assert reviews.started == ["running", "five"]


async def test_an_id_is_free_again_once_its_answer_is_being_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that reuses an id as soon as its answer arrives (sequential scripts
    do) is served, even while that answer's write has not returned yet: the id
    leaves the in-flight table before the answer is written."""
    reviews = Reviews(held=set())
    monkeypatch.setattr(server_module, "claude_review", reviews)
    out: list[Any] = []
    reused_read = asyncio.Event()

    async def answered(count: int) -> None:
        await reviews.until(lambda: len(out) >= count)

    async def first_answered() -> None:
        await answered(1)

    async def reuse_handled() -> None:
        reused_read.set()  # the frame read before this read has been handled
        await answered(2)

    async def hold(reply: Any) -> None:
        if reply["result"]["content"][0]["text"] == "reviewed one":
            await reused_read.wait()  # the first answer's write returns only then

    script = [
        (None, f"{review(1, 'one')}\n".encode()),
        (first_answered, f"{review(1, 'two')}\n".encode()),
        (reuse_handled, b""),
    ]
    await run(script, out, reviews.changed, hold)
    assert [reply["result"]["content"][0]["text"] for reply in out] == [
        "reviewed one",
        "reviewed two",
    ]


BIG_IDS = [2**64, 2**70, -(2**63) - 1, 2**64 - 1, -(2**63), 7]


@pytest.mark.parametrize("rid", BIG_IDS)
def test_an_integer_id_of_any_size_is_decoded_exactly(rid: int) -> None:
    """orjson reads an integer outside [-2**63, 2**64) as a float, so the id lost its
    precision (2**64 + 1 came back as 1.8446744073709552e19); it is read exactly."""
    frame = f'{{"jsonrpc":"2.0","id":{rid},"method":"ping"}}'.encode()
    decoded = protocol.decode(frame)
    assert isinstance(decoded, jsonrpc.Request)
    assert type(decoded.id) is int and decoded.id == rid
    cancel_frame = (
        f'{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{rid}}}}}'
    )
    decoded = protocol.decode(cancel_frame.encode())
    assert isinstance(decoded, jsonrpc.Request)
    assert type(decoded.params["requestId"]) is int and decoded.params["requestId"] == rid
    refused = protocol.decode(
        f'{{"jsonrpc":"2.0","id":{rid},"method":"ping","params":[]}}'.encode()
    )
    assert isinstance(refused, dict) and refused["id"] == rid and type(refused["id"]) is int


def test_a_number_written_as_a_fraction_stays_a_float() -> None:
    """Only integers are read exactly: ``1e20`` and ``2.5`` stay the floats they are."""
    for text, value in (("1e20", 1e20), ("2.5", 2.5), ("-1.8446744073709552e19", -(2.0**64))):
        decoded = protocol.decode(f'{{"jsonrpc":"2.0","id":{text},"method":"ping"}}'.encode())
        assert isinstance(decoded, jsonrpc.Request)
        assert type(decoded.id) is float and decoded.id == value


async def test_big_integer_ids_are_echoed_exactly_and_can_be_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every answer carries the id as it was sent, digit for digit (a frame, a batch
    element, an error), and a ``notifications/cancelled`` naming a big id reaches
    its call. (The id came back as a float, ``1.8446744073709552e+19``: a client
    matching answers to requests never found its answer.)"""
    reviews = Reviews(held={"held"})
    monkeypatch.setattr(server_module, "claude_review", reviews)
    lines: list[bytes] = []
    out: list[Any] = []

    async def held_started() -> None:
        await reviews.until(lambda: "held" in reviews.started and len(out) == 1 + len(BIG_IDS) + 2)

    async def held_cancelled() -> None:
        await reviews.until(lambda: reviews.cancelled)

    frames = [INIT_0326.decode().strip()]
    frames += [f'{{"jsonrpc":"2.0","id":{rid},"method":"ping"}}' for rid in BIG_IDS]
    frames.append(f'{{"jsonrpc":"2.0","id":{2**70 + 1},"method":"tools/call","params":5}}')
    frames.append(
        "["
        + ",".join(f'{{"jsonrpc":"2.0","id":{rid},"method":"ping"}}' for rid in (2**65, -(2**64)))
        + "]"
    )
    frames.append(review(2**66, "held"))
    script = [
        (None, "\n".join(frames).encode() + b"\n"),
        (held_started, f"{cancel(2**66)}\n".encode()),
        (held_cancelled, b""),
    ]

    async def read() -> bytes:
        if not script:
            return b""
        before, chunk = script.pop(0)
        if before is not None:
            await before()
        return chunk

    async def write(data: bytes) -> None:
        lines.append(data)
        out.append(json.loads(data))  # the standard library keeps big integers
        reviews.changed.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
    pings = [reply["id"] for reply in out if isinstance(reply, dict) and reply.get("result") == {}]
    assert sorted(pings) == sorted(BIG_IDS)
    assert all(type(rid) is int for rid in pings)
    (error,) = [reply for reply in out if isinstance(reply, dict) and "error" in reply]
    assert error["id"] == 2**70 + 1 and error["error"]["code"] == -32700
    (batch,) = [reply for reply in out if isinstance(reply, list)]
    assert [reply["id"] for reply in batch] == [2**65, -(2**64)]
    assert b'"id":18446744073709551616,' in b"".join(lines)
    assert reviews.cancelled == ["held"]
    assert len(out) == 1 + len(BIG_IDS) + 2  # the cancelled call got no answer
