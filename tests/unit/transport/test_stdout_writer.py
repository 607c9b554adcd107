"""``stdout_writer``: one line at a time on the fd, even when a writer is cancelled.

A write runs in a worker thread (``asyncio.to_thread``), which a cancellation
cannot stop: the awaiting task ends while the thread goes on writing its line.
The MCP toolbridge cancels a call on ``notifications/cancelled`` (and acp-stdio a
request), possibly while its response is being written; the next line must not
be written into the middle of that one.
"""

from __future__ import annotations

import asyncio
import threading
import types

import pytest

from xwm_bridge.transport import stdio


async def test_a_cancelled_write_finishes_its_line_before_the_next_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    big, small = b"A" * 100 + b"\n", b"ping\n"
    out = bytearray()
    gate = threading.Event()  # holds the first line halfway, like a full pipe
    loop = asyncio.get_running_loop()
    halfway, second_started = asyncio.Event(), asyncio.Event()
    calls = 0

    def fake_write(_fd: int, data: memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:  # the first half of the big line, then the pipe is "full"
            out.extend(data[:50])
            loop.call_soon_threadsafe(halfway.set)
            return 50
        if bytes(data) == small:
            loop.call_soon_threadsafe(second_started.set)
        else:
            assert gate.wait(10), "the first line was never let through"
        out.extend(data)
        return len(data)

    monkeypatch.setattr(stdio, "os", types.SimpleNamespace(write=fake_write))
    write = stdio.stdout_writer(1)
    first = asyncio.ensure_future(write(big))
    await asyncio.wait_for(halfway.wait(), 10)
    first.cancel()  # the call whose response this is was cancelled mid-write
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.ensure_future(write(small))
    # the next line must wait for the first to end; give it a bounded chance to
    # start anyway (it did at once: a second thread wrote into the first line)
    with_overlap = True
    try:
        await asyncio.wait_for(second_started.wait(), 1)
    except TimeoutError:
        with_overlap = False
    gate.set()
    await asyncio.wait_for(second, 10)
    assert not with_overlap
    assert bytes(out) == big + small
