"""A bug while the read loop handles a frame (a turn's tap, the event handler, the read
itself) never leaves the socket up with nobody reading it: a handler's bug is logged
and skipped, and any other end of the loop drops the socket, so turns waiting on
``socket_lost`` and pending requests are released at once, not at their deadlines."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from tests.conftest import wait_until
from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.errors import GatewayError
from xwm_bridge.gateway.runtime import GatewayRuntime

#: only a hang would reach it: every wait below is released by the loop itself
GUARD = 5.0


class FrameSocket:
    """A gateway socket fed by the test: frames (or an exception to raise) in order."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self.sent: list[bytes] = []
        self.closed = asyncio.Event()

    async def send(self, data: bytes, text: bool = False) -> None:
        self.sent.append(data)

    async def recv(self) -> bytes:
        item = await self.inbox.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        self.closed.set()

    def event(self, name: str, seq: int) -> None:
        frame = {"type": "event", "event": name, "payload": {}, "seq": seq}
        self.inbox.put_nowait(orjson.dumps(frame))

    def answer(self, index: int) -> None:
        request_id = orjson.loads(self.sent[index])["id"]
        frame = {"type": "res", "id": request_id, "ok": True, "payload": {"n": index}}
        self.inbox.put_nowait(orjson.dumps(frame))


def reading(ws: FrameSocket) -> tuple[GatewayRuntime, asyncio.Task[None]]:
    """A connected runtime whose loop reads ``ws`` (no config: no reconnect after)."""
    rt = GatewayRuntime("rt", "alice", GatewayConfig())
    rt._ws = ws  # type: ignore[assignment]
    rt.snapshot.status = "connected"
    task = rt._loop_task = asyncio.ensure_future(rt._run(ws))  # type: ignore[arg-type]
    return rt, task


def failures(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage() == message and r.levelno == logging.ERROR and r.exc_info
    ]


@pytest.mark.parametrize("where", ["tap", "handler"])
async def test_a_bug_handling_one_event_is_logged_and_the_read_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    ws = FrameSocket()
    rt, task = reading(ws)
    seen: list[str] = []
    after = asyncio.Event()

    def recorder(ev: p.EventFrame) -> None:
        seen.append(ev.event)
        if ev.event == "after":
            after.set()

    if where == "tap":

        def buggy_tap(ev: p.EventFrame) -> None:
            if ev.event == "boom":
                raise RuntimeError("bug in a tap")

        rt.add_tap(buggy_tap)
    else:
        handle = rt._events.handle

        def buggy_handle(*args: object) -> bool:
            if args[0].event == "boom":  # type: ignore[attr-defined]
                raise RuntimeError("bug in the handler")
            return handle(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(rt._events, "handle", buggy_handle)
    rt.add_tap(recorder)
    call = asyncio.ensure_future(rt.request("health", {}, 30))
    try:
        await wait_until(lambda: len(ws.sent) == 1)
        ws.event("boom", 1)
        ws.event("after", 2)
        ws.answer(0)  # a response read after the failed event still reaches its request
        await asyncio.wait_for(after.wait(), GUARD)
        assert await asyncio.wait_for(call, GUARD) == {"n": 0}
        assert "after" in seen and not task.done() and rt.connected
        message = "gateway event tap failed" if where == "tap" else "gateway frame handling failed"
        assert len(failures(caplog, message)) == 1  # with its traceback, at error level
    finally:
        await rt.close()
        await asyncio.gather(call, return_exceptions=True)


async def test_a_read_that_fails_unexpectedly_drops_the_socket_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ws = FrameSocket()
    rt, task = reading(ws)
    lost = rt.socket_lost  # what a gateway turn waits on
    call = asyncio.ensure_future(rt.request("health", {}, 3600))
    try:
        await wait_until(lambda: len(ws.sent) == 1)
        ws.inbox.put_nowait(OSError("the read broke"))  # neither a close nor a timeout
        await asyncio.wait_for(asyncio.shield(lost), GUARD)
        with pytest.raises(GatewayError) as err:
            await asyncio.wait_for(call, GUARD)  # not at its one-hour deadline
        assert err.value.code == "SOCKET_CLOSED"
        assert ws.closed.is_set() and rt._ws is None and not rt.connected
        assert rt.snapshot.status == "error" and rt.snapshot.last_error_code == "SOCKET_CLOSED"
        assert len(failures(caplog, "gateway socket read failed")) == 1
        await asyncio.wait_for(task, GUARD)  # no config: no reconnect follows
    finally:
        await rt.close()
        await asyncio.gather(call, return_exceptions=True)


async def test_a_loop_ended_from_outside_drops_its_socket() -> None:
    ws = FrameSocket()
    rt, task = reading(ws)
    lost = rt.socket_lost
    call = asyncio.ensure_future(rt.request("health", {}, 3600))
    try:
        await wait_until(lambda: len(ws.sent) == 1)
        task.cancel()  # not by the runtime's own stop (a supervisor's shutdown, say)
        await asyncio.wait_for(asyncio.shield(lost), GUARD)
        with pytest.raises(GatewayError) as err:
            await asyncio.wait_for(call, GUARD)
        assert err.value.code == "SOCKET_CLOSED" and ws.closed.is_set() and rt._ws is None
    finally:
        await rt.close()
        await asyncio.gather(call, return_exceptions=True)
