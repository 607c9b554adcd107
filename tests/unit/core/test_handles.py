"""xwm_bridge.core.handles.TurnHandle: a turn's cancel is not lost in a third-party
``asyncio.wait_for`` (CPython 3.11), and the re-sent cancels keep the accounting right.

The other TurnHandle tests (cancel before/while running, shutdown) are in
``test_sessions.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from xwm_bridge.core import handles
from xwm_bridge.core.handles import TurnHandle, cancel_arrived

#: the bound of every wait of these tests (the first re-send comes after RESEND = 1 s)
BOUND = 5


async def _cancelled() -> str:
    return "on_cancel"


async def _turn(handle: TurnHandle, run: Callable[[], Awaitable[str]]) -> tuple[str, int]:
    result = await handle.execute(run, _cancelled)
    task = asyncio.current_task()
    assert task is not None
    return result, task.cancelling()


class LostCancel:
    """An executor awaiting a stdlib ``asyncio.wait_for`` (as redis-py, aiohttp and
    websockets do) whose inner future completes in the loop iteration the cancel is
    delivered in: 3.11's ``wait_for`` returns the result and drops the cancel. The
    turn then goes on to a wait that only a cancel ends (its agent working on)."""

    def __init__(self) -> None:
        self.inner: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiting = asyncio.Event()
        self.got: list[int] = []
        self.rest = asyncio.Event()  # never set: the rest of the turn

    async def run(self) -> str:
        self.waiting.set()
        self.got.append(await asyncio.wait_for(self.inner, BOUND))
        await self.rest.wait()
        return "ran to its end"

    def cancel_with_the_answer(self, handle: TurnHandle) -> None:
        # both land in the next loop iteration: the waiter's wake-up with the cancel,
        # and the inner future's result, which wait_for then returns
        self.inner.set_result(1)
        assert handle.cancel() is True


async def test_a_cancel_lost_in_a_third_party_wait_for_is_sent_again() -> None:
    """``session.cancel`` answered ``cancelled: true`` while the turn, its one cancel
    dropped by 3.11's ``asyncio.wait_for``, ran on to its end."""
    handle = TurnHandle("s", "turn-1")
    ex = LostCancel()
    task = asyncio.create_task(_turn(handle, ex.run))
    await asyncio.wait_for(ex.waiting.wait(), BOUND)
    ex.cancel_with_the_answer(handle)
    async with asyncio.timeout(BOUND):
        result = await task
    assert ex.got == [1]  # the cancel was indeed lost there (else the test shows nothing)
    assert result == ("on_cancel", 0)  # cancelled, and every cancel sent was consumed
    assert handle.finished and handle._resend is None
    assert handle.cancel() is False


async def test_a_shutdown_still_propagates_when_the_client_cancel_was_sent_again() -> None:
    handle = TurnHandle("s", "turn-1")
    ex = LostCancel()
    resent = asyncio.Event()

    async def run() -> str:
        try:
            return await ex.run()
        except asyncio.CancelledError:
            resent.set()  # the re-sent client cancel arrived
            await asyncio.Event().wait()  # an executor's cleanup, ended by the shutdown
            raise

    task = asyncio.create_task(handle.execute(run, _cancelled))
    await asyncio.wait_for(ex.waiting.wait(), BOUND)
    ex.cancel_with_the_answer(handle)
    await asyncio.wait_for(resent.wait(), BOUND)
    task.cancel()  # not through the handle: a shutdown
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(BOUND):
            await task
    assert task.cancelled()


async def test_a_cleanup_after_cancel_arrived_is_not_cut_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An executor that catches the cancel to clean up (send the upstream cancel, wait
    for the agent's answer) says so with :func:`cancel_arrived`: the cancel is not sent
    again into its cleanup."""
    monkeypatch.setattr(handles, "RESEND", 0)  # a re-send would come at the next iteration
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()
    cleaning = asyncio.Event()
    cleaned = asyncio.Event()
    interrupted: list[bool] = []

    async def run() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancel_arrived()
            cleaning.set()
            try:
                await cleaned.wait()
            except asyncio.CancelledError:
                interrupted.append(True)
            raise
        return "never"

    task = asyncio.create_task(_turn(handle, run))
    await asyncio.wait_for(started.wait(), BOUND)
    handle.cancel()
    await asyncio.wait_for(cleaning.wait(), BOUND)
    for _ in range(20):  # loop iterations in which a re-send (RESEND = 0) would land
        await asyncio.sleep(0)
    cleaned.set()
    assert await asyncio.wait_for(task, BOUND) == ("on_cancel", 0)
    assert interrupted == []
    assert handle._resend is None and not handles._RESENDING


async def test_the_re_sent_cancels_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An executor that swallows every cancel (and never says it arrived) gets at most
    RESENDS more; the task is left with no cancellation pending once it ends."""
    monkeypatch.setattr(handles, "RESEND", 0)
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()
    let_go = asyncio.Event()
    swallowed = 0

    async def run() -> str:
        nonlocal swallowed
        started.set()
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                swallowed += 1
        return "stopped by the agent"

    task = asyncio.create_task(_turn(handle, run))
    await asyncio.wait_for(started.wait(), BOUND)
    handle.cancel()
    for _ in range(4 * handles.RESENDS):  # enough iterations for every re-send
        await asyncio.sleep(0)
    assert swallowed == 1 + handles.RESENDS
    assert handle._resend is None and not handles._RESENDING
    let_go.set()
    assert await asyncio.wait_for(task, BOUND) == ("stopped by the agent", 0)
    assert handle.cancel_requested


async def test_an_async_with_exit_before_cancel_arrived_is_not_cut_short() -> None:
    """The cancel lands in an ``async with`` whose exit (closing a stream, 0.4 s) runs
    before the executor's ``except CancelledError`` can say it arrived: a re-send every
    0.1 s cut that exit short. The first re-send now comes after RESEND (1 s)."""
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()
    exits: list[str] = []

    class Stream:
        async def __aenter__(self) -> Stream:
            return self

        async def __aexit__(self, *exc: object) -> None:
            try:
                await asyncio.sleep(0.4)
            except asyncio.CancelledError:
                exits.append("cut")
                raise
            exits.append("closed")

    async def run() -> str:
        try:
            async with Stream():
                started.set()
                await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancel_arrived()
            raise
        return "never"

    task = asyncio.create_task(_turn(handle, run))
    await asyncio.wait_for(started.wait(), BOUND)
    handle.cancel()
    assert await asyncio.wait_for(task, BOUND) == ("on_cancel", 0)
    assert exits == ["closed"]
    assert handle._resend is None and not handles._RESENDING


def test_the_re_sends_of_a_turns_cancel_grow() -> None:
    delays = [handles.resend_delay(n) for n in range(handles.RESENDS)]
    assert delays[0] == handles.RESEND == 1.0
    assert delays == sorted(delays) and max(delays) == handles.RESEND_MAX
