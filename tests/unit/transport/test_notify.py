"""OrderedSender: one write at a time, in order; a missed deadline breaks it for good."""

from __future__ import annotations

import asyncio

from xwm_bridge.transport.notify import OrderedSender


async def test_writes_in_order_one_at_a_time() -> None:
    written: list[bytes] = []
    busy = 0

    async def write(data: bytes) -> None:
        nonlocal busy
        busy += 1
        assert busy == 1  # never two writes at once
        await asyncio.sleep(0)
        written.append(data)
        busy -= 1

    sender = OrderedSender(write, timeout=5)
    results = await asyncio.gather(*(sender.send_bytes(b"%d" % i) for i in range(5)))
    assert results == [True] * 5
    assert written == [b"0", b"1", b"2", b"3", b"4"]


async def test_a_write_past_its_deadline_breaks_the_sender() -> None:
    never = asyncio.Event()
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        if data == b"stuck":
            await never.wait()
        written.append(data)

    sender = OrderedSender(write, timeout=0.05)
    assert await sender.send_bytes(b"a") is True
    assert await sender.send_bytes(b"stuck") is False  # bounded: returns, never hangs
    assert sender.broken
    assert await sender.send_bytes(b"b") is False  # dropped, not written
    assert written == [b"a"]


async def test_a_failed_write_breaks_the_sender() -> None:
    async def write(data: bytes) -> None:
        raise ConnectionResetError("gone")

    sender = OrderedSender(write, timeout=5)
    assert await sender.send_bytes(b"a") is False
    assert sender.broken


async def test_cancelling_the_sender_is_not_a_timeout() -> None:
    started = asyncio.Event()

    async def write(data: bytes) -> None:
        started.set()
        await asyncio.Event().wait()

    sender = OrderedSender(write, timeout=5)
    task = asyncio.ensure_future(sender.send_bytes(b"a"))
    await started.wait()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the cancellation was swallowed")
    assert not sender.broken
