"""``StdinInput``: stdin read on a thread; ``end()`` is the end of input a signal asks for."""

from __future__ import annotations

import asyncio
import os

from xwm_bridge.transport.stdio import PENDING_CHUNKS, StdinInput


async def test_chunks_arrive_in_order_then_the_end_of_input() -> None:
    r, w = os.pipe()
    try:
        stdin = StdinInput(r)
        os.write(w, b"one\n")
        assert await asyncio.wait_for(stdin.read(), 5) == b"one\n"
        os.close(w)
        w = -1
        assert await asyncio.wait_for(stdin.read(), 5) == b""
        assert await asyncio.wait_for(stdin.read(), 5) == b""  # and again: nothing waits
    finally:
        if w >= 0:
            os.close(w)


async def test_end_wakes_a_read_waiting_on_a_silent_stdin() -> None:
    """A signal's shutdown ends the input of a client that sends nothing: the server
    then answers what runs instead of being cancelled with it."""
    r, w = os.pipe()
    try:
        stdin = StdinInput(r)
        waiting = asyncio.ensure_future(stdin.read())
        await asyncio.sleep(0)
        assert not waiting.done()
        stdin.end()
        assert await asyncio.wait_for(waiting, 5) == b""
        os.write(w, b"after the end\n")  # not read any more
        assert await stdin.read() == b""
    finally:
        os.close(w)


async def test_a_flood_on_stdin_waits_in_the_thread_not_in_memory() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        stdin = StdinInput(r)
        sent = 0
        for _ in range(4 * PENDING_CHUNKS):
            try:
                sent += os.write(w, b"x" * 4096)
            except BlockingIOError:
                break
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.2)
        assert len(stdin._chunks) <= PENDING_CHUNKS
        got = 0
        while got < sent:
            got += len(await asyncio.wait_for(stdin.read(), 5))
        assert got == sent
    finally:
        os.close(w)
