"""``StdioServer``: requests run concurrently, at most the per-connection limit at once.

Past the limit, requests wait in arrival order; past ``MAX_WAITING`` of them the
server stops reading (the stream cannot refuse what it has not read). A cancel
does not wait: a client whose slots are all taken can still cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from tests.conftest import wait_until
from xwm_bridge import inflight
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.core.context import CallContext
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.transport import stdio
from xwm_bridge.transport.stdio import StdioServer

pytestmark = pytest.mark.asyncio


@dataclass
class Harness:
    """The server's stdin (one chunk per request), its methods, and what it wrote."""

    chunks: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    reads: int = 0
    running: set[str] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    release: dict[str, asyncio.Event] = field(default_factory=dict)
    written: list[dict[str, Any]] = field(default_factory=list)
    peak: int = 0

    async def read(self) -> bytes:
        self.reads += 1
        return await self.chunks.get()

    async def write(self, data: bytes) -> None:
        self.written.extend(orjson.loads(line) for line in data.splitlines())

    def send(self, method: str, rid: str) -> None:
        self.release.setdefault(rid, asyncio.Event())
        body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"n": rid}}
        self.chunks.put_nowait(orjson.dumps(body) + b"\n")

    async def hold(self, params: dict[str, Any], call: CallContext, method: str) -> dict[str, Any]:
        n = params["n"]
        self.running.add(n)
        self.started.append(n)
        self.peak = max(self.peak, len(self.running))
        try:
            await self.release[n].wait()
        finally:
            self.running.discard(n)
        return {"n": n}

    def answered(self) -> list[str]:
        return [m["id"] for m in self.written]

    async def settle(self) -> None:
        """Let the server run every step it can take without new input."""
        for _ in range(20):
            await asyncio.sleep(0)


@pytest.fixture
async def harness() -> AsyncIterator[tuple[Harness, asyncio.Task[None]]]:
    h = Harness()
    table = {"hold": h.hold, "session.cancel": h.hold}
    server = StdioServer(
        Dispatcher(table, Metrics()), h.read, h.write, max_message=1 << 20, send_timeout=5
    )
    serving = asyncio.create_task(server.serve())
    try:
        yield h, serving
    finally:
        for event in h.release.values():
            event.set()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_past_the_limit_requests_wait_in_order_and_start_as_slots_free(
    monkeypatch: pytest.MonkeyPatch, harness: tuple[Harness, asyncio.Task[None]]
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 2)
    h, serving = harness
    for rid in ("1", "2", "3", "4"):
        h.send("hold", rid)
    await wait_until(lambda: h.reads == 5)  # all four read; reading goes on
    await h.settle()
    assert h.started == ["1", "2"]
    h.release["2"].set()
    await wait_until(lambda: h.started == ["1", "2", "3"])
    h.release["1"].set()
    await wait_until(lambda: h.started == ["1", "2", "3", "4"])
    h.release["3"].set()
    h.release["4"].set()
    h.chunks.put_nowait(b"")  # end of input: the server ends once all answered
    await asyncio.wait_for(serving, 5)
    assert h.peak == 2
    assert sorted(h.answered()) == ["1", "2", "3", "4"]
    assert all(m["result"] == {"n": m["id"]} for m in h.written)


async def test_reading_stops_when_too_many_wait(
    monkeypatch: pytest.MonkeyPatch, harness: tuple[Harness, asyncio.Task[None]]
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 1)
    monkeypatch.setattr(stdio, "MAX_WAITING", 2)
    h, _serving = harness
    for rid in ("1", "2", "3", "4"):
        h.send("hold", rid)
    await wait_until(lambda: h.reads == 3)
    await h.settle()
    assert h.reads == 3  # "1" runs, "2" and "3" wait: "4" is not read
    assert h.started == ["1"]
    h.release["1"].set()
    await wait_until(lambda: h.started == ["1", "2"])
    await wait_until(lambda: h.reads == 4)  # reading again: "4" read, and it waits
    await h.settle()
    assert h.reads == 4  # "3" and "4" wait: reading stops again


async def test_a_cancel_overtakes_the_waiting_requests(
    monkeypatch: pytest.MonkeyPatch, harness: tuple[Harness, asyncio.Task[None]]
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 1)
    h, _serving = harness
    h.send("hold", "turn")
    h.send("hold", "queued")
    h.send("session.cancel", "cancel")
    await wait_until(lambda: h.started == ["turn", "cancel"])
    h.release["cancel"].set()
    await wait_until(lambda: h.answered() == ["cancel"])
    h.send("session.cancel", "second")  # twice the limit: two running, the cancel waits
    await wait_until(lambda: h.reads == 5)
    await h.settle()
    assert h.started == ["turn", "cancel", "second"]
    h.send("session.cancel", "third")
    await wait_until(lambda: h.reads == 6)
    await h.settle()
    assert h.started == ["turn", "cancel", "second"]  # at twice the limit: it waits
    h.release["turn"].set()
    h.release["second"].set()
    await wait_until(lambda: h.started[3:] == ["queued", "third"])


async def _served(lines: list[bytes], *, max_message: int) -> list[dict[str, Any]]:
    """Every line written for ``lines`` (one chunk each, then end of input)."""
    h = Harness()

    async def echo(params: dict[str, Any], _call: CallContext, _method: str) -> dict[str, Any]:
        return {"echo": params.get("n")}

    server = StdioServer(
        Dispatcher({"echo": echo}, Metrics()),
        h.read,
        h.write,
        max_message=max_message,
        send_timeout=5,
    )
    for line in [*lines, b""]:
        h.chunks.put_nowait(line)
    await asyncio.wait_for(server.serve(), 10)
    return h.written


async def test_a_request_past_the_limit_is_answered_by_the_id_its_head_holds() -> None:
    """contract.md §8/§14: a frame too large is ``-32700`` (kept, message and all), but
    answered by its id when its first bytes hold it: id null left the client waiting."""
    pad = "x" * 600
    big = b'{"jsonrpc":"2.0","id":"big-1","method":"echo","params":{"pad":"%s"}}' % pad.encode()
    cased = b'{"Id":7,"Method":"echo","params":{"pad":"%s"}}' % pad.encode()
    note = b'{"jsonrpc":"2.0","method":"echo","params":{"pad":"%s"}}' % pad.encode()
    late = b'{"jsonrpc":"2.0","method":"echo","params":{"pad":"%s"},"id":9}' % pad.encode()
    after = b'{"jsonrpc":"2.0","id":"after","method":"echo","params":{"n":1}}'
    written = await _served(
        [big + b"\n", cased + b"\n", note + b"\n", late + b"\n", after + b"\n"], max_message=256
    )
    too_large = {"code": -32700, "message": "message too large: limit is 256 bytes"}
    assert written == [
        {"jsonrpc": "2.0", "id": "big-1", "error": too_large},
        {"jsonrpc": "2.0", "id": 7, "error": too_large},  # names matched as §8 matches them
        # a notification, or a request whose id is past the head: id null, as before
        {"jsonrpc": "2.0", "id": None, "error": too_large},
        {"jsonrpc": "2.0", "id": None, "error": too_large},
        {"jsonrpc": "2.0", "id": "after", "result": {"echo": 1}},  # the stream goes on
    ]


async def test_refusals_are_counted_by_what_was_wrong() -> None:
    """A frame over the limit is ``message_too_large`` in xwm_rejected_requests_total
    (operations.md), not ``parse_error``: its answer's code is -32700 all the same."""
    h = Harness()

    async def echo(params: dict[str, Any], _call: CallContext, _method: str) -> dict[str, Any]:
        return {"echo": params.get("n")}

    metrics = Metrics()
    server = StdioServer(
        Dispatcher({"echo": echo}, metrics), h.read, h.write, max_message=256, send_timeout=5
    )
    big = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"pad":"%s"}}' % (b"x" * 600)
    for line in [big + b"\n", b"{not json\n", b""]:
        h.chunks.put_nowait(line)
    await asyncio.wait_for(server.serve(), 10)
    assert [m["error"]["code"] for m in h.written] == [-32700, -32700]

    def count(reason: str) -> float | None:
        labels = {"transport": "stdio", "reason": reason}
        return metrics.registry.get_sample_value("xwm_rejected_requests_total", labels)

    assert (count("message_too_large"), count("parse_error")) == (1.0, 1.0)
