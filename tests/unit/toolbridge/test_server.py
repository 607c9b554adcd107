"""The toolbridge stdio loop in-process: call slots and the in-flight table."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import aiohttp
import orjson
import pytest

from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge import server as server_module
from xwm_bridge.toolbridge.server import ToolbridgeServer


async def test_cancel_before_the_call_starts_frees_its_slot() -> None:
    """A request and its ``notifications/cancelled`` in one read: the call is cancelled
    before its first step, and its slot and in-flight entry are still released (they
    leaked, and with every slot gone the server stopped reading stdin for good)."""
    chunks = [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}\n',
        b'{"jsonrpc":"2.0","id":2,"method":"ping"}\n',
    ]
    replied = asyncio.Event()
    out: list[bytes] = []

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        await replied.wait()
        return b""

    async def write(data: bytes) -> None:
        out.append(data)
        replied.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(
            ToolbridgeConfig(max_concurrent_calls=1), http, read, write, max_message=1 << 20
        )
        await asyncio.wait_for(server.serve(), 10)
    assert [orjson.loads(line) for line in out] == [{"jsonrpc": "2.0", "id": 2, "result": {}}]
    assert server._inflight == {}


async def test_cancel_and_ping_are_read_while_every_slot_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With every call slot taken and one more call waiting for a slot, the server
    still reads on: a ``notifications/cancelled`` reaches the running call and a
    ``ping`` is answered (the reader waited for a slot, so neither was read until a
    running call ended, and the cancelled call's response was sent after all)."""
    started: list[str] = []
    cancelled: list[str] = []
    running = {1: asyncio.Event(), 2: asyncio.Event()}
    both_cancelled, replied = asyncio.Event(), asyncio.Event()

    async def review(_cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
        started.append(args["prompt"])
        running[len(started)].set()
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            cancelled.append(args["prompt"])
            if len(cancelled) == 2:
                both_cancelled.set()
            raise
        return "unreachable"

    monkeypatch.setattr(server_module, "claude_review", review)
    call = (
        '{{"jsonrpc":"2.0","id":{0},"method":"tools/call",'
        '"params":{{"name":"claude_review","arguments":{{"prompt":"p{0}"}}}}}}\n'
    )
    cancel = '{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{0}}}}}\n'
    script = [  # (what has happened before, the next read)
        (None, (call.format(1) + call.format(2)).encode()),
        (running[1], cancel.format(1).encode()),  # call 2 is waiting for the only slot
        (running[2], b'{"jsonrpc":"2.0","id":3,"method":"ping"}\n'),
        (replied, cancel.format(2).encode()),
        (both_cancelled, b""),
    ]
    out: list[bytes] = []

    async def read() -> bytes:
        event, chunk = script.pop(0)
        if event is not None:
            await event.wait()
        return chunk

    async def write(data: bytes) -> None:
        out.append(data)
        replied.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(
            ToolbridgeConfig(max_concurrent_calls=1), http, read, write, max_message=1 << 20
        )
        await asyncio.wait_for(server.serve(), 10)
    assert [orjson.loads(line) for line in out] == [{"jsonrpc": "2.0", "id": 3, "result": {}}]
    assert started == ["p1", "p2"]  # call 2 took the slot call 1's cancel freed
    assert cancelled == ["p1", "p2"]
    assert server._inflight == {}


async def test_a_notification_method_sent_with_an_id_is_answered_and_cancels_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message with an id is a request (MCP: notifications MUST NOT include an id),
    so it is answered: ``notifications/cancelled`` with an id got no response at all
    (and cancelled the call it named); now it is ``-32601`` like any unknown method."""
    gate = asyncio.Event()
    replies: dict[Any, dict[str, Any]] = {}
    all_replied = asyncio.Event()

    async def review(cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
        await gate.wait()
        return "done"

    monkeypatch.setattr(server_module, "claude_review", review)
    chunks = [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        b'"params":{"name":"claude_review","arguments":{"prompt":"p"}}}\n'
        b'{"jsonrpc":"2.0","id":7,"method":"notifications/cancelled",'
        b'"params":{"requestId":1}}\n'
        b'{"jsonrpc":"2.0","id":"n","method":"notifications/initialized"}\n'
    ]

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        await all_replied.wait()
        return b""

    async def write(data: bytes) -> None:
        reply = orjson.loads(data)
        replies[reply["id"]] = reply
        if {7, "n"} <= set(replies):
            gate.set()  # the call named by the "cancel" is still running: let it finish
        if len(replies) == 3:
            all_replied.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
    assert replies[7]["error"] == {
        "code": -32601,
        "message": "unknown method: notifications/cancelled",
    }
    assert replies["n"]["error"] == {
        "code": -32601,
        "message": "unknown method: notifications/initialized",
    }
    assert replies[1]["result"]["content"][0]["text"] == "done"


INIT_0326 = (
    b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}\n'
)
REVIEW = (
    '{{"jsonrpc":"2.0","id":{0},"method":"tools/call",'
    '"params":{{"name":"claude_review","arguments":{{"prompt":"p{0}"}}}}}}'
)
CANCEL = '{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{0}}}}}'


async def test_a_request_in_a_batch_can_be_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """``notifications/cancelled`` reaches a request inside a batch, whether it comes
    in the same batch or in a later frame: the batch's array leaves that request out
    (MCP: a cancelled request gets no response) and still answers the others."""
    running: dict[str, asyncio.Event] = {"p1": asyncio.Event(), "p2": asyncio.Event()}
    gate = asyncio.Event()

    async def review(_cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
        running.setdefault(args["prompt"], asyncio.Event()).set()
        await gate.wait()
        return "reviewed " + args["prompt"]

    monkeypatch.setattr(server_module, "claude_review", review)
    batch = ",".join([REVIEW.format(1), CANCEL.format(1), REVIEW.format(2), REVIEW.format(3)])
    script: list[tuple[asyncio.Event | None, bytes]] = [
        (None, INIT_0326 + f"[{batch}]\n".encode()),
        (running["p2"], (CANCEL.format(2) + "\n").encode()),
    ]
    out: list[Any] = []
    replied = asyncio.Event()

    async def read() -> bytes:
        if script:
            event, chunk = script.pop(0)
            if event is not None:
                await event.wait()
            return chunk
        gate.set()  # the cancel of call 2 was handled before this read
        await replied.wait()
        return b""

    async def write(data: bytes) -> None:
        out.append(orjson.loads(data))
        if isinstance(out[-1], list):
            replied.set()

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
    assert out[0]["id"] == 0
    assert out[1:] == [
        [
            {
                "jsonrpc": "2.0",
                "id": 3,
                "result": {"content": [{"type": "text", "text": "reviewed p3"}]},
            }
        ]
    ]
    assert not running["p1"].is_set()  # cancelled before it started
    assert server._inflight == {}


async def test_a_batch_whose_requests_are_all_cancelled_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JSON-RPC 2.0: a batch with no answer to send gets no output, not ``[]``."""
    started = asyncio.Event()

    async def review(_cfg: ToolbridgeConfig, _args: dict[str, Any]) -> str:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        return "unreachable"

    monkeypatch.setattr(server_module, "claude_review", review)
    chunks = [INIT_0326 + f"[{REVIEW.format(1)}]\n".encode(), (CANCEL.format(1) + "\n").encode()]
    out: list[Any] = []

    async def read() -> bytes:
        if len(chunks) == 1:
            await started.wait()
        return chunks.pop(0) if chunks else b""

    async def write(data: bytes) -> None:
        out.append(orjson.loads(data))

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=1 << 20)
        await asyncio.wait_for(server.serve(), 10)
    assert [reply["id"] for reply in out] == [0]
    assert server._inflight == {}


async def test_a_batch_counts_against_the_waiting_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request of a batch takes an admission as a frame of its own does: a batch
    as large as allowed fills them all, so reading stops until one ends (one frame
    cannot start more work than the limits allow), and all are answered in one array."""
    gate = asyncio.Event()

    async def review(_cfg: ToolbridgeConfig, args: dict[str, Any]) -> str:
        await gate.wait()
        return args["prompt"]

    monkeypatch.setattr(server_module, "claude_review", review)
    seen: dict[str, Any] = {}
    out: list[Any] = []
    chunks: list[bytes] = []

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        if not gate.is_set():
            seen["locked"] = server._admitted.locked()
            seen["inflight"] = len(server._inflight)
            gate.set()
        return b""

    async def write(data: bytes) -> None:
        out.append(orjson.loads(data))

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(
            ToolbridgeConfig(max_concurrent_calls=1), http, read, write, max_message=1 << 20
        )
        assert server.max_batch == 1 + server_module.MAX_WAITING
        calls = ",".join(REVIEW.format(i) for i in range(1, server.max_batch + 1))
        chunks.append(INIT_0326 + f"[{calls}]\n".encode())
        await asyncio.wait_for(server.serve(), 10)
    assert seen == {"locked": True, "inflight": server.max_batch}
    (batch,) = [reply for reply in out if isinstance(reply, list)]
    assert [reply["id"] for reply in batch] == list(range(1, server.max_batch + 1))
    assert server._admitted._value == server.max_batch  # every admission given back


async def test_a_request_past_the_limit_is_answered_by_the_id_its_head_holds() -> None:
    """A frame too large keeps ``-32700 message too large`` but is answered by the id its
    first bytes hold (id null left the client waiting for ever); a notification, or an
    id past the head, keeps id null; a boolean id is no id; the stream goes on."""
    pad = b"x" * 600
    lines = [
        b'{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{"pad":"%s"}}' % pad,
        b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"pad":"%s"}}' % pad,
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"pad":"%s"}}' % pad,
        b'{"jsonrpc":"2.0","method":"ping","params":{"pad":"%s"},"id":3}' % pad,
        b'{"jsonrpc":"2.0","id":true,"method":"ping","params":{"pad":"%s"}}' % pad,
        b'{"jsonrpc":"2.0","id":4,"method":"ping"}',
    ]
    chunks = [line + b"\n" for line in lines]
    out: list[bytes] = []

    async def read() -> bytes:
        return chunks.pop(0) if chunks else b""

    async def write(data: bytes) -> None:
        out.append(data)

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(ToolbridgeConfig(), http, read, write, max_message=256)
        await asyncio.wait_for(server.serve(), 10)
    too_large = {"code": -32700, "message": "message too large: limit is 256 bytes"}
    assert [orjson.loads(line) for line in out] == [
        {"jsonrpc": "2.0", "id": "big", "error": too_large},
        {"jsonrpc": "2.0", "id": 12, "error": too_large},
        {"jsonrpc": "2.0", "id": None, "error": too_large},
        {"jsonrpc": "2.0", "id": None, "error": too_large},
        {"jsonrpc": "2.0", "id": None, "error": too_large},
        {"jsonrpc": "2.0", "id": 4, "result": {}},
    ]


class _WatchedSemaphore(asyncio.Semaphore):
    """An admission semaphore that says when its acquirer has to wait."""

    def __init__(self, value: int, blocked: asyncio.Event) -> None:
        super().__init__(value)
        self.blocked = blocked
        self.waiting = 0

    async def acquire(self) -> Literal[True]:
        if not self.locked():
            return await super().acquire()
        self.waiting += 1
        self.blocked.set()
        try:
            return await super().acquire()
        finally:
            self.waiting -= 1


async def test_a_batch_answer_not_yet_written_keeps_its_admissions() -> None:
    """A batch's requests are unanswered until its array is written: with the client
    not reading stdout, reading stops once ``max_batch`` requests wait for their
    answer to go out (their admissions were given back when they ended, so the
    server read on without limit, each array waiting in memory for the write)."""
    release, blocked = asyncio.Event(), asyncio.Event()
    frames = 3 * (1 + server_module.MAX_WAITING)
    chunk = INIT_0326 + b"".join(
        b'[{"jsonrpc":"2.0","id":%d,"method":"ping"}]\n' % i for i in range(1, frames + 1)
    )
    chunks = [chunk]
    admitted: list[asyncio.Task[Any]] = []
    counts = {"written": 0, "peak": 0}
    ids: list[int] = []

    async def read() -> bytes:
        if chunks:
            return chunks.pop(0)
        release.set()  # end of input: let every answer out
        return b""

    async def write(data: bytes) -> None:
        reply = orjson.loads(data)
        if isinstance(reply, list):  # a batch's answer: the client is not reading
            await release.wait()
            counts["written"] += len(reply)
            ids.extend(r["id"] for r in reply)

    async with aiohttp.ClientSession() as http:
        server = ToolbridgeServer(
            ToolbridgeConfig(max_concurrent_calls=1), http, read, write, max_message=1 << 20
        )
        semaphore = _WatchedSemaphore(server.max_batch, blocked)
        server._admitted = semaphore
        admit = server._admit

        async def counted(req: Any, coro: Any, **kwargs: Any) -> Any:
            task = await admit(req, coro, **kwargs)
            if req.method == "ping":
                admitted.append(task)
                unanswered = len(admitted) - counts["written"]
                counts["peak"] = max(counts["peak"], unanswered)
            return task

        server._admit = counted  # type: ignore[method-assign]
        serving = asyncio.create_task(server.serve())
        while not serving.done():
            waiter = asyncio.create_task(blocked.wait())
            await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if serving.done():
                break
            blocked.clear()
            known = len(admitted)
            await asyncio.wait(admitted)
            if len(admitted) == known and semaphore.waiting:
                release.set()  # the reader stays stopped while every answer waits
        await asyncio.wait_for(serving, 10)
    assert counts["peak"] <= server.max_batch
    assert ids == list(range(1, frames + 1))
