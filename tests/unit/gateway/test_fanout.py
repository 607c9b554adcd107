"""A runtime's notifications never wait on a client (gateway.md, ownership).

The socket reader used to await every owner connection's delivery, each cut at
``notify_timeout``: one owner that stopped reading held every other owner's events,
and the responses to ``chat.send`` / ``chat.abort``, for that long on every event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
import websockets

from tests.conftest import wait_until
from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import fanout
from xwm_bridge.gateway.runtime import GatewayRuntime
from xwm_bridge.tasks import Supervisor, wait_for


class ScriptedSocket:
    """A gateway socket: the test feeds the frames read; sent requests are recorded."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.requests: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def recv(self) -> bytes:
        data = await self.inbox.get()
        if data is None:
            raise websockets.ConnectionClosedOK(None, None)
        return data

    async def send(self, data: bytes, text: bool = False) -> None:
        self.requests.put_nowait(json.loads(data))

    async def close(self) -> None:
        self.inbox.put_nowait(None)

    def event(self, name: str, payload: dict[str, Any], seq: int) -> None:
        frame = {"type": "event", "event": name, "payload": payload, "seq": seq}
        self.inbox.put_nowait(json.dumps(frame).encode())

    def respond(self, request_id: str, payload: dict[str, Any]) -> None:
        frame = {"type": "res", "id": request_id, "ok": True, "payload": payload}
        self.inbox.put_nowait(json.dumps(frame).encode())


class Owner:
    """An owner's live connection (``.notify``, ``.closed``)."""

    def __init__(self, stalled: bool = False) -> None:
        self.stalled = stalled
        self.closed = False
        self.got: list[dict[str, Any]] = []
        self.writing = asyncio.Event()
        self.changed = asyncio.Event()

    async def notify(self, message: dict[str, Any]) -> None:
        if self.stalled:
            self.writing.set()
            await asyncio.Event().wait()  # stopped reading: the write never completes
        self.got.append(message)
        self.changed.set()

    def pushes(self) -> list[str]:
        return [
            m["params"]["event"]["event"]
            for m in self.got
            if m["method"] == "xworkmate.gateway.push"
        ]


def reading_runtime(ws: ScriptedSocket, tasks: Supervisor, **settings: Any) -> GatewayRuntime:
    rt = GatewayRuntime("rt", "alice", GatewayConfig(**settings), tasks)
    rt._ws = ws  # type: ignore[assignment]
    rt.snapshot.status = "connected"
    rt._loop_task = tasks.spawn(rt._run(ws), name="gateway:rt", service=True)  # type: ignore[arg-type]
    return rt


async def test_a_stalled_owner_holds_back_neither_other_owners_nor_responses() -> None:
    tasks = Supervisor()
    ws = ScriptedSocket()
    # far past the guards below: a reader waiting on the stalled write fails them
    rt = reading_runtime(ws, tasks, notify_timeout=30)
    stalled, healthy = Owner(stalled=True), Owner()
    rt.attach(None, stalled)
    rt.attach(None, healthy)
    try:
        send = asyncio.ensure_future(rt.request("chat.send", {"sessionKey": "k"}, 30))
        req = await wait_for(ws.requests.get(), 2)
        ws.event("health", {"ok": True}, 1)
        ws.event("presence", {"n": 1}, 2)
        ws.respond(req["id"], {"runId": "r1"})
        ws.event("presence", {"n": 2}, 3)
        assert await wait_for(send, 2) == {"runId": "r1"}  # the response is not held back
        await wait_for(stalled.writing.wait(), 2)
        await wait_until(lambda: len(healthy.pushes()) == 3, 2)
        assert healthy.pushes() == ["health", "presence", "presence"]  # in order
        methods = [m["method"] for m in healthy.got]
        assert methods[0] == "xworkmate.gateway.snapshot"  # the health snapshot first
        assert not stalled.got
    finally:
        await wait_for(rt.close(), 5)
    assert tasks.tasks() == []


async def test_an_owner_whose_outbox_overflows_is_dropped_with_one_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout, "OUTBOX_SIZE", 4)
    tasks = Supervisor()
    ws = ScriptedSocket()
    rt = reading_runtime(ws, tasks, notify_timeout=30)
    stalled, healthy = Owner(stalled=True), Owner()
    rt.attach(None, stalled)
    rt.attach(None, healthy)
    caplog.set_level(logging.WARNING, "xwm_bridge.gateway")
    try:
        for seq in range(1, 21):
            ws.event("presence", {"n": seq}, seq)
        await wait_until(lambda: len(healthy.pushes()) == 20, 2)
        warnings = [r for r in caplog.records if "notification" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert getattr(warnings[0], "reason", None) == "overflow"
        assert rt._fanout.dropped == {"overflow": 1, "timeout": 0}
        # dropped for the rest of its connection: its stalled write is cut, no writer left
        box = rt._fanout._outboxes[stalled.notify]
        assert box.dropped and not box.queue
        await wait_until(lambda: box.task is None, 2)
        ws.event("presence", {"n": 21}, 21)
        await wait_until(lambda: len(healthy.pushes()) == 21, 2)
        assert len([r for r in caplog.records if "notification" in r.getMessage()]) == 1
    finally:
        await wait_for(rt.close(), 5)
    assert tasks.tasks() == []


async def test_an_owner_whose_write_times_out_is_dropped() -> None:
    tasks = Supervisor()
    ws = ScriptedSocket()
    rt = reading_runtime(ws, tasks, notify_timeout=0.05)
    stalled, healthy = Owner(stalled=True), Owner()
    rt.attach(None, stalled)
    rt.attach(None, healthy)
    try:
        ws.event("presence", {"n": 1}, 1)
        await wait_until(lambda: rt._fanout.dropped["timeout"] == 1, 2)
        ws.event("presence", {"n": 2}, 2)
        await wait_until(lambda: len(healthy.pushes()) == 2, 2)
        assert rt._fanout.dropped == {"overflow": 0, "timeout": 1}
        assert not stalled.got
    finally:
        await wait_for(rt.close(), 5)
    assert tasks.tasks() == []


async def test_close_ends_every_writer_even_one_stalled() -> None:
    tasks = Supervisor()
    ws = ScriptedSocket()
    rt = reading_runtime(ws, tasks, notify_timeout=30)
    stalled, healthy = Owner(stalled=True), Owner()
    rt.attach(None, stalled)
    rt.attach(None, healthy)
    ws.event("presence", {"n": 1}, 1)
    await wait_for(stalled.writing.wait(), 2)
    await wait_until(lambda: len(healthy.pushes()) == 1, 2)
    await wait_for(rt.close(), 10)  # the stalled write is cut, not waited out (30 s)
    assert tasks.tasks() == []
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway")]
    assert left == [], left


async def test_a_closed_connections_writer_ends_and_it_gets_nothing_more() -> None:
    tasks = Supervisor()
    ws = ScriptedSocket()
    rt = reading_runtime(ws, tasks, notify_timeout=30)
    owner, other = Owner(stalled=True), Owner()
    rt.attach(None, owner)
    rt.attach(None, other)
    try:
        ws.event("presence", {"n": 1}, 1)
        await wait_for(owner.writing.wait(), 2)
        writer = rt._fanout._outboxes[owner.notify].task
        assert writer is not None
        owner.closed = True
        assert rt.has_live_owner()  # the other one
        await wait_for(asyncio.wait({writer}), 2)  # its pending write was cut
        assert owner.notify not in rt._fanout._outboxes
        ws.event("presence", {"n": 2}, 2)
        await wait_until(lambda: len(other.pushes()) == 2, 2)
        assert owner.notify not in rt._fanout._outboxes and not owner.got
    finally:
        await wait_for(rt.close(), 5)
    assert tasks.tasks() == []


async def test_a_call_gets_the_notifications_it_caused_before_it_returns() -> None:
    """A call's own sink (an SSE response) is flushed before the call answers: the
    notifications come before the result, as when delivery was awaited."""
    tasks = Supervisor()
    rt = GatewayRuntime("rt", "alice", GatewayConfig(), tasks)
    got: list[dict[str, Any]] = []

    async def notify(message: dict[str, Any]) -> None:
        await asyncio.sleep(0)  # a write that takes a loop turn or two
        got.append(message)

    rt.attach(notify, None)
    rt._notices.log("info", "connect", "one")
    rt._notices.log("info", "connect", "two")
    await wait_for(rt.settle(notify, None), 2)
    rt.detach(notify, None)
    assert [m["params"]["log"]["message"] for m in got] == ["one", "two"]
    await wait_until(lambda: tasks.tasks() == [], 2)  # detach ended its writer
    await rt.close()
