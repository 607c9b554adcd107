"""xwm_bridge.app.methods._queued: a queued turn's result, or its withdrawal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from xwm_bridge.app.methods import _queued
from xwm_bridge.core.queues import ThreadQueues, WithdrawnError
from xwm_bridge.tasks import Supervisor


@pytest.fixture
async def queues() -> AsyncIterator[ThreadQueues]:
    sup = Supervisor()
    yield ThreadQueues(sup)
    await sup.shutdown(0)


class Held:
    """A job that runs until :attr:`gate` is set; :attr:`started` once it runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.started, self.gate = asyncio.Event(), asyncio.Event()

    async def __call__(self) -> str:
        self.started.set()
        await self.gate.wait()
        return self.name


async def drained(queues: ThreadQueues, thread_id: str) -> None:
    """Once a job queued now has run, every earlier one of the thread has had its turn."""
    last = Held("last")
    last.gate.set()
    assert await queues.submit(thread_id, last) == "last"


async def test_without_withdrawn_it_is_the_result(queues: ThreadQueues) -> None:
    job = Held("a")
    job.gate.set()
    assert await _queued(queues, "t", queues.submit_nowait("t", job), None) == "a"


async def test_withdrawn_while_waiting_leaves_the_queue_and_never_runs(
    queues: ThreadQueues,
) -> None:
    first, second = Held("first"), Held("second")
    running = queues.submit_nowait("t", first)
    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(
        _queued(queues, "t", queues.submit_nowait("t", second), withdrawn)
    )
    await first.started.wait()
    withdrawn.set_result(None)
    with pytest.raises(WithdrawnError):
        await waiting
    assert queues.depth("t") == 0
    first.gate.set()
    assert await running == "first"
    assert not second.started.is_set()


async def test_withdrawn_before_it_was_submitted_never_runs(queues: ThreadQueues) -> None:
    job = Held("a")
    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    withdrawn.set_result(None)
    with pytest.raises(WithdrawnError):
        await _queued(queues, "t", queues.submit_nowait("t", job), withdrawn)
    await drained(queues, "t")
    assert not job.started.is_set()


async def test_withdrawn_once_started_waits_for_the_result(queues: ThreadQueues) -> None:
    job = Held("a")
    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(_queued(queues, "t", queues.submit_nowait("t", job), withdrawn))
    await job.started.wait()
    withdrawn.set_result(None)  # its own cancel stops a running turn, not the queue
    await asyncio.sleep(0)
    assert not waiting.done()
    job.gate.set()
    assert await waiting == "a"


async def test_a_caller_cancelled_while_waiting_has_its_turn_skipped(
    queues: ThreadQueues,
) -> None:
    first, second = Held("first"), Held("second")
    running = queues.submit_nowait("t", first)
    fut = queues.submit_nowait("t", second)
    withdrawn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(_queued(queues, "t", fut, withdrawn))
    await first.started.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert fut.cancelled()
    first.gate.set()
    assert await running == "first"
    await drained(queues, "t")
    assert not second.started.is_set()
