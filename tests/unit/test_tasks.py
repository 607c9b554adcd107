"""xwm_bridge.tasks: Supervisor (owner of background tasks), stop, Deadlines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import pytest

from xwm_bridge.tasks import (
    STOP_GRACE,
    STOP_RESEND_MAX,
    Deadlines,
    Supervisor,
    resend_delay,
    stop,
    stop_all,
)


async def test_spawned_task_is_tracked_until_done() -> None:
    sup = Supervisor()
    gate = asyncio.Event()

    async def work() -> str:
        await gate.wait()
        return "done"

    task = sup.spawn(work(), name="worker")
    assert task.get_name() == "worker"
    assert len(sup) == 1
    gate.set()
    assert await task == "done"
    await asyncio.sleep(0)
    assert len(sup) == 0


async def test_failure_is_logged_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor()

    async def boom() -> None:
        raise RuntimeError("kaput")

    task = sup.spawn(boom(), name="boomer")
    with caplog.at_level(logging.ERROR, logger="xwm_bridge.tasks"):
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)
    assert len(sup) == 0
    records = [r for r in caplog.records if r.name == "xwm_bridge.tasks"]
    assert len(records) == 1
    assert records[0].getMessage() == "background task failed"
    assert getattr(records[0], "task", None) == "boomer"


async def test_an_awaited_failure_is_left_to_its_awaiter(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``awaited=True``: the caller awaits the task and handles its failure (an agent that
    exits mid-prompt is a failed turn, logged as such): no second "background task
    failed" error with a traceback for the same failure."""
    sup = Supervisor()

    async def boom() -> None:
        raise RuntimeError("kaput")

    task = sup.spawn(boom(), name="prompt", awaited=True)
    with caplog.at_level(logging.ERROR, logger="xwm_bridge.tasks"):
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)
    assert len(sup) == 0
    assert not [r for r in caplog.records if r.name == "xwm_bridge.tasks"]


async def test_cancelled_task_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor()
    task = sup.spawn(asyncio.Event().wait(), name="idle")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="xwm_bridge.tasks"):
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
    assert not [r for r in caplog.records if r.name == "xwm_bridge.tasks"]
    assert len(sup) == 0


async def test_shutdown_lets_quick_tasks_finish() -> None:
    sup = Supervisor()
    finished: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0.01)
        finished.append("quick")

    task = sup.spawn(quick(), name="quick")
    assert not sup.closing
    await sup.shutdown(grace=5)
    assert sup.closing
    assert finished == ["quick"]
    assert task.done() and not task.cancelled()


async def test_shutdown_cancels_after_grace() -> None:
    sup = Supervisor()
    task = sup.spawn(asyncio.Event().wait(), name="stuck")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await sup.shutdown(grace=0.05)
    assert task.cancelled()
    assert loop.time() - started < 5
    assert len(sup) == 0


async def test_shutdown_with_zero_grace_cancels_at_once() -> None:
    sup = Supervisor()
    task = sup.spawn(asyncio.Event().wait(), name="stuck")
    await sup.shutdown(grace=0)
    assert task.cancelled()


async def test_shutdown_with_nothing_running() -> None:
    sup = Supervisor()
    await sup.shutdown(grace=10)
    assert sup.closing


async def test_wait_for_keeps_a_cancel_that_arrives_with_the_result() -> None:
    """CPython 3.11's asyncio.wait_for returns the result and drops the cancellation when
    both land in one loop iteration; a turn's cancel was lost that way (the turn then ran
    to its end). tasks.wait_for keeps it, and still times out."""
    from xwm_bridge.tasks import wait_for

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    after: list[int] = []

    async def waiter() -> None:
        after.append(await wait_for(fut, 5))
        await asyncio.sleep(0)
        after.append(2)  # only if the cancellation was lost

    task = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)
    fut.set_result(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert after in ([], [1])
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.sleep(5), 0.01)
    assert await wait_for(asyncio.sleep(0, "x"), None) == "x"


def test_no_module_uses_asyncio_wait_for() -> None:
    """Every deadline in the package goes through tasks.wait_for (see above)."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "xwm_bridge"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "wait_for"
                and isinstance(node.value, ast.Name)
                and node.value.id == "asyncio"
            ):
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == [], found


async def test_stop_sends_the_cancel_again_until_the_task_ends() -> None:
    """A cancel can be lost (redis-py's write under 3.11's asyncio.wait_for): ``stop``
    cancels again until the task has ended, and gives up, saying so, past its bound."""
    swallowed = 0

    async def loses_two_cancels() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 2:
                    raise

    task = asyncio.get_running_loop().create_task(loses_two_cancels())
    await asyncio.sleep(0)
    assert await stop(task, 5) is True
    assert task.cancelled() and swallowed == 3

    let_go = False

    async def ends_only_when_let_go() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if let_go:
                    raise

    stuck = asyncio.get_running_loop().create_task(ends_only_when_let_go())
    await asyncio.sleep(0)
    assert await stop(stuck, 0.3) is False
    let_go = True
    assert await stop(stuck, 5) is True


async def test_shutdown_cancels_again_a_task_that_lost_its_cancel() -> None:
    """``shutdown`` cancelled each task once and waited 10 s: a task that lost that
    cancel (3.11's ``asyncio.wait_for`` in a library) ran on through the wait and past
    it. Now it is cancelled again until it ends, within the same bound."""
    sup = Supervisor()
    running = asyncio.Event()
    swallowed: list[bool] = []

    async def loses_a_cancel() -> None:
        while True:
            running.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)

    task = sup.spawn(loses_a_cancel(), name="lossy", service=True)
    quiet = sup.spawn(asyncio.Event().wait(), name="quiet")
    await asyncio.wait_for(running.wait(), 5)
    async with asyncio.timeout(5):  # the old wait took 10 s
        await sup.shutdown(grace=0)
    assert task.cancelled() and quiet.cancelled() and swallowed == [True]


def _slow_cleanup(cleaned: list[str], started: asyncio.Event) -> Coroutine[Any, Any, None]:
    """A task whose cleanup after the cancel awaits 0.4 s (closing a connection, a
    final store write) before it re-raises."""

    async def run() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            try:
                await asyncio.sleep(0.4)
            except asyncio.CancelledError:
                cleaned.append("cut")
                raise
            cleaned.append("done")
            raise

    return run()


async def test_stop_does_not_cut_a_cleanup_short() -> None:
    """The cancel was sent again every 0.1 s, into the cleanup of a task that had
    taken the first one: the second cancel cut a 0.4 s cleanup short. The first
    re-send now comes after STOP_GRACE (1 s)."""
    cleaned: list[str] = []
    started = asyncio.Event()
    task = asyncio.get_running_loop().create_task(_slow_cleanup(cleaned, started))
    await asyncio.wait_for(started.wait(), 5)
    assert await stop(task, 5) is True
    assert task.cancelled() and cleaned == ["done"]


async def test_stop_all_does_not_cut_cleanups_short() -> None:
    cleaned: list[str] = []
    tasks = []
    for _ in range(3):
        started = asyncio.Event()
        tasks.append(asyncio.get_running_loop().create_task(_slow_cleanup(cleaned, started)))
        await asyncio.wait_for(started.wait(), 5)
    assert await stop_all(tasks, 5) is True
    assert cleaned == ["done"] * 3


async def test_shutdown_does_not_cut_a_cleanup_short() -> None:
    sup = Supervisor()
    cleaned: list[str] = []
    started = asyncio.Event()
    sup.spawn(_slow_cleanup(cleaned, started), name="cleans-up", service=True)
    await asyncio.wait_for(started.wait(), 5)
    async with asyncio.timeout(5):
        await sup.shutdown(grace=0)
    assert cleaned == ["done"]


def test_the_re_sends_grow_and_stay_inside_the_bound() -> None:
    """The first re-send after STOP_GRACE, then longer and longer intervals, at most
    STOP_RESEND_MAX apart."""
    delays = [resend_delay(n) for n in range(6)]
    assert delays[0] == STOP_GRACE == 1.0
    assert delays == sorted(delays)
    assert max(delays) == STOP_RESEND_MAX


# --- Deadlines: asyncio.timeout's behaviour, on one loop timer ----------------------------


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


async def test_a_block_past_its_deadline_raises_timeout_error() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError), deadlines.within(0.05) as block:
        await _never()
    assert block.expired and loop.time() - began >= 0.04  # uvloop: a clock in ms
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # its cancel was taken back
    assert deadlines.open_blocks() == 0


async def test_a_block_that_ends_in_time_is_left_alone() -> None:
    deadlines = Deadlines()
    with deadlines.within(0.05) as block:
        await asyncio.sleep(0)
    assert not block.expired and deadlines.open_blocks() == 0
    # past the first block's deadline, nothing cancels this task
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(_never(), 0.2)


async def test_many_blocks_of_one_length_arm_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        if callback == deadlines._fire:
            armed.append(when)
        return call_at(when, callback, *args)

    monkeypatch.setattr(loop, "call_at", counting)
    gate = asyncio.Event()

    async def call() -> str:
        with deadlines.within(60):
            await gate.wait()
        return "ok"

    calls = [asyncio.create_task(call()) for _ in range(50)]
    await asyncio.sleep(0)
    assert deadlines.open_blocks() == 50
    gate.set()
    assert await asyncio.gather(*calls) == ["ok"] * 50
    assert len(armed) == 1 and deadlines.open_blocks() == 0


async def test_a_shorter_block_after_a_longer_one_expires_on_time() -> None:
    deadlines = Deadlines()
    started = asyncio.Event()

    async def long() -> None:
        with deadlines.within(60):
            started.set()
            await _never()

    async def short() -> None:
        with deadlines.within(0.05):
            await _never()

    slow = asyncio.create_task(long())
    await started.wait()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(TimeoutError):
        await short()
    assert loop.time() - began < 2.0
    assert not slow.done()
    slow.cancel()  # a cancel from elsewhere stays a cancel, not a timeout
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert deadlines.open_blocks() == 0


async def test_a_cancel_meeting_the_deadline_stays_a_cancel() -> None:
    """As asyncio.timeout: when the task is also cancelled from elsewhere, the block
    raises CancelledError (the other cancel is not turned into a timeout)."""
    deadlines = Deadlines()

    async def call() -> None:
        with deadlines.within(0.05):
            try:
                await _never()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # another cancel arrives while this one unwinds
                raise

    task = asyncio.create_task(call())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
