"""xwm_bridge.core.queues.ThreadQueues: per-thread FIFO, bounded, self-reaping.

contract.md §12.2, with this project's fixes (bounded depth, reaping, skipped abandoned turns).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from xwm_bridge.core.queues import QueueFullError, ThreadQueues
from xwm_bridge.tasks import Supervisor


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    sup = Supervisor()
    yield sup
    await sup.shutdown(0)


async def settle(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def gated(
    log: list[str], name: str, gate: asyncio.Event | None = None
) -> Callable[[], Awaitable[str]]:
    async def job() -> str:
        log.append(f"start:{name}")
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(0)
        log.append(f"end:{name}")
        return name

    return job


async def test_returns_job_result(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)

    async def job() -> dict[str, int]:
        return {"n": 1}

    assert await queues.submit("t", job) == {"n": 1}


async def test_fifo_and_one_at_a_time_within_a_thread(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    log: list[str] = []
    active = 0
    peak = 0

    def make(i: int) -> Callable[[], Awaitable[int]]:
        async def job() -> int:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            log.append(f"start:{i}")
            for _ in range(3):
                await asyncio.sleep(0)
            log.append(f"end:{i}")
            active -= 1
            return i

        return job

    results = await asyncio.gather(*(queues.submit("thread-1", make(i)) for i in range(8)))
    assert results == list(range(8))
    assert peak == 1
    assert log == [f"{kind}:{i}" for i in range(8) for kind in ("start", "end")]


async def test_threads_run_in_parallel(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    def make(me: str, other: str) -> Callable[[], Awaitable[str]]:
        async def job() -> str:
            started[me].set()
            await asyncio.wait_for(started[other].wait(), 5)  # deadlocks if serialized
            return me

        return job

    results = await asyncio.gather(
        queues.submit("a", make("a", "b")), queues.submit("b", make("b", "a"))
    )
    assert list(results) == ["a", "b"]


async def test_queue_full_when_max_depth_waiting(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor, max_depth=2)
    gate = asyncio.Event()
    log: list[str] = []
    running = asyncio.ensure_future(queues.submit("t", gated(log, "run", gate)))
    await settle()
    assert log == ["start:run"]
    assert queues.depth("t") == 0
    waiting = [asyncio.ensure_future(queues.submit("t", gated(log, f"w{i}"))) for i in range(2)]
    await settle()
    assert queues.depth("t") == 2
    assert queues.total_waiting() == 2

    with pytest.raises(QueueFullError) as info:
        await queues.submit("t", gated(log, "overflow"))
    assert info.value.thread_id == "t"
    assert info.value.depth == 2
    assert "thread queue is full" in str(info.value)
    assert "t" in str(info.value)

    # another thread is unaffected
    assert await queues.submit("other", gated(log, "other")) == "other"

    gate.set()
    assert await running == "run"
    assert [await w for w in waiting] == ["w0", "w1"]
    assert "start:overflow" not in log


async def test_burst_on_idle_thread_counts_only_waiting_turns(supervisor: Supervisor) -> None:
    # 1 turn may run and max_depth may wait, even when all arrive before the worker starts
    queues = ThreadQueues(supervisor, max_depth=2)
    gate = asyncio.Event()
    log: list[str] = []
    tasks = [asyncio.ensure_future(queues.submit("t", gated(log, str(i), gate))) for i in range(4)]
    await settle()
    assert [t.done() for t in tasks] == [False, False, False, True]
    with pytest.raises(QueueFullError):
        tasks[3].result()
    gate.set()
    assert await asyncio.gather(*tasks[:3]) == ["0", "1", "2"]


async def test_depth_frees_as_turns_finish(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor, max_depth=1)
    gate = asyncio.Event()
    log: list[str] = []
    first = asyncio.ensure_future(queues.submit("t", gated(log, "1", gate)))
    await settle()
    second = asyncio.ensure_future(queues.submit("t", gated(log, "2", gate)))
    await settle()
    with pytest.raises(QueueFullError):
        await queues.submit("t", gated(log, "x"))
    gate.set()
    await first
    await settle()
    # "2" is running now, the slot is free again
    third = asyncio.ensure_future(queues.submit("t", gated(log, "3")))
    assert await second == "2"
    assert await third == "3"


async def test_thread_entry_disappears_once_drained(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()
    log: list[str] = []
    assert len(queues) == 0
    pending = [
        asyncio.ensure_future(queues.submit(f"t{i % 3}", gated(log, str(i), gate)))
        for i in range(6)
    ]
    await settle()
    assert len(queues) == 3
    assert len(supervisor) == 3  # one worker per thread
    gate.set()
    await asyncio.gather(*pending)
    await settle()
    assert len(queues) == 0
    assert queues.depth("t0") == 0
    assert len(supervisor) == 0
    # a thread can be used again afterwards
    assert await queues.submit("t0", gated(log, "again")) == "again"
    await settle()
    assert len(queues) == 0


async def test_cancelled_waiter_job_is_skipped(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()
    log: list[str] = []
    first = asyncio.ensure_future(queues.submit("t", gated(log, "first", gate)))
    await settle()
    abandoned = asyncio.ensure_future(queues.submit("t", gated(log, "abandoned")))
    last = asyncio.ensure_future(queues.submit("t", gated(log, "last")))
    await settle()
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    gate.set()
    assert await first == "first"
    assert await last == "last"
    assert "start:abandoned" not in log
    assert log == ["start:first", "end:first", "start:last", "end:last"]


async def test_waiter_cancelled_while_running_does_not_stop_the_queue(
    supervisor: Supervisor,
) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()
    log: list[str] = []
    running = asyncio.ensure_future(queues.submit("t", gated(log, "running", gate)))
    await settle()
    nxt = asyncio.ensure_future(queues.submit("t", gated(log, "next")))
    running.cancel()
    await settle()
    gate.set()
    assert await nxt == "next"
    # the job itself was not cancelled (only its submitter went away)
    assert log == ["start:running", "end:running", "start:next", "end:next"]


async def test_job_exception_goes_to_its_submitter_only(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()

    async def boom() -> Any:
        await gate.wait()
        raise ValueError("upstream broke")

    async def fine() -> str:
        return "fine"

    bad = asyncio.ensure_future(queues.submit("t", boom))
    good = asyncio.ensure_future(queues.submit("t", fine))
    other = asyncio.ensure_future(queues.submit("u", fine))
    await settle()
    gate.set()
    with pytest.raises(ValueError, match="upstream broke"):
        await bad
    assert await good == "fine"
    assert await other == "fine"
    await settle()
    assert len(queues) == 0


async def test_shutdown_cancels_waiting_submitters(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    never = asyncio.Event()
    log: list[str] = []
    running = asyncio.ensure_future(queues.submit("t", gated(log, "stuck", never)))
    waiting = asyncio.ensure_future(queues.submit("t", gated(log, "waiting")))
    await settle()
    await supervisor.shutdown(0)
    for fut in (running, waiting):
        with pytest.raises(asyncio.CancelledError):
            await fut
    assert "start:waiting" not in log
    assert len(queues) == 0


def test_queue_full_error_fields() -> None:
    err = QueueFullError("thread-9", 32)
    assert err.thread_id == "thread-9"
    assert err.depth == 32
    assert "32" in str(err) and "thread-9" in str(err)


async def test_withdraw_takes_a_waiting_job_off_its_queue(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()
    log: list[str] = []
    running = asyncio.ensure_future(queues.submit("t", gated(log, "running", gate)))
    await settle()
    waiting = queues.submit_nowait("t", gated(log, "waiting"))
    after = asyncio.ensure_future(queues.submit("t", gated(log, "after")))
    await settle()
    assert queues.depth("t") == 2
    assert queues.withdraw("t", waiting) is True
    # gone at once: its place is free, its future cancelled, the others keep their order
    assert waiting.cancelled()
    assert queues.depth("t") == 1
    assert queues.withdraw("t", waiting) is False  # only once
    gate.set()
    assert await running == "running"
    assert await after == "after"
    assert log == ["start:running", "end:running", "start:after", "end:after"]


async def test_withdraw_refuses_a_job_that_started(supervisor: Supervisor) -> None:
    queues = ThreadQueues(supervisor)
    gate = asyncio.Event()
    log: list[str] = []
    fut = queues.submit_nowait("t", gated(log, "running", gate))
    await settle()
    assert log == ["start:running"]
    # it runs: withdrawing it would report a turn that runs as never started
    assert queues.withdraw("t", fut) is False
    assert queues.withdraw("other", fut) is False
    gate.set()
    assert await fut == "running"
    assert queues.withdraw("t", fut) is False  # done, and its thread gone
