"""Owner of every background task: spawned here, cancelled here on shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Awaitable, Collection, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("xwm_bridge.tasks")
T = TypeVar("T")


class Supervisor:
    """A registry of tasks that outlive the call that started them.

    Each task is removed when it ends; an exception it raises is logged, never
    lost. :meth:`wait` waits for the *work* tasks (turns, upstream cancels);
    *service* tasks (reapers, listeners: ``service=True``) run until
    :meth:`shutdown`, which waits up to a grace period, then cancels the rest.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._services: set[asyncio.Task[Any]] = set()
        self._closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closing(self) -> bool:
        return self._closing

    def spawn(
        self, coro: Coroutine[Any, Any, T], *, name: str, service: bool = False
    ) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        (self._services if service else self._tasks).add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._services.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "background task failed",
                exc_info=task.exception(),
                extra={"task": task.get_name()},
            )

    def tasks(self) -> list[asyncio.Task[Any]]:
        """Every task it owns now, work and service."""
        return [*self._tasks, *self._services]

    def begin_shutdown(self) -> None:
        self._closing = True

    async def wait(self, within: float | None) -> bool:
        """Wait up to ``within`` seconds (None: as long as it takes) for every work
        task, including ones spawned meanwhile; True when none is left."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while self._tasks:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            await asyncio.wait(set(self._tasks), timeout=remaining)
        return True

    async def wait_any(self) -> None:
        """Until one work task ends (back-pressure for a bounded number in flight)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)

    async def shutdown(self, grace: float) -> None:
        """Let work tasks finish for ``grace`` seconds, then cancel every task and wait
        for them, at most :data:`SHUTDOWN_WAIT` seconds, cancelling again the ones that
        run on past :data:`STOP_GRACE` (:func:`stop_all`: a cancel can be lost, and a
        cleanup of up to 1 s is not cut)."""
        self._closing = True
        await self.wait(grace)
        pending = self._tasks | self._services
        if pending:
            await stop_all(pending, SHUTDOWN_WAIT)


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109 (its API)
    """``asyncio.wait_for`` without CPython 3.11's lost cancellation: when the awaited
    result and a cancel of the caller land in one loop iteration, 3.11's ``wait_for``
    returns the result and the cancel is gone (a turn's cancel was lost so). This runs
    the awaitable in the caller's task under ``asyncio.timeout``, which keeps it, and
    raises ``TimeoutError`` past ``timeout`` seconds (``None``: no deadline)."""
    if timeout is None:
        return await aw
    async with asyncio.timeout(timeout):
        return await aw


#: seconds before :func:`stop` first sends its cancel again to a task that runs on:
#: a cleanup of up to this long after the first cancel is never cut short
STOP_GRACE = 1.0
#: the longest interval between two later sends (each interval doubles up to it)
STOP_RESEND_MAX = 2.0
#: how long :meth:`Supervisor.shutdown` waits for the tasks it cancelled
SHUTDOWN_WAIT = 10.0
#: task names a warning of :func:`stop_all` lists, at most
NAMES_LOGGED = 8


def resend_delay(sent: int) -> float:
    """Seconds from send number ``sent`` (0: the first cancel) to the next one:
    :data:`STOP_GRACE`, then twice the interval before, at most :data:`STOP_RESEND_MAX`
    (0, 1, 3, 5, 7, 9 s after the first cancel)."""
    return min(STOP_GRACE * 2.0**sent, STOP_RESEND_MAX)


async def stop(task: asyncio.Task[Any], within: float) -> bool:
    """Cancel ``task`` and wait up to ``within`` seconds for it to end; True if it did.

    The cancel is sent again while the task runs on, first after :data:`STOP_GRACE`
    seconds, then at growing intervals (:func:`resend_delay`), all inside ``within``:
    one can be lost (CPython 3.11's ``asyncio.wait_for``, which redis-py puts around
    each command's write, returns the write's result and drops a cancel of its caller
    landing in the same loop iteration), and a loop task that lost it ran on, so a
    ``close()`` awaiting it never returned.

    Why a grace and not a test of the task: a task that took the cancel and is
    unwinding (an ``except CancelledError:`` or ``finally:`` that awaits a close or a
    last store write) and one whose cancel a ``wait_for`` swallowed look alike from
    outside on 3.11. Both had ``CancelledError`` thrown into their coroutine, and
    ``task.cancelling()`` stays 1 in both (3.11's ``wait_for`` drops the cancel without
    ``uncancel()``); only the frame's place in its handler differs, which Python does
    not expose. A cancel re-sent every 0.1 s cut every cleanup longer than that; now a
    cleanup of up to :data:`STOP_GRACE` (1 s) is never cut, a longer one may be cut at
    the first re-send, and a lost cancel is recovered 1 s later (then 2 s apart) as
    long as ``within`` lasts. A cancel of the caller is never swallowed here."""
    return await stop_all((task,), within)


async def stop_all(tasks: Collection[asyncio.Task[Any]], within: float) -> bool:
    """:func:`stop` for several tasks at once: True if every one ended within ``within``
    seconds, else a warning naming (some of) those left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    running = {task for task in tasks if not task.done()}
    sent = 0
    next_send = loop.time()
    while running:
        now = loop.time()
        left = deadline - now
        if left <= 0:
            names = sorted(task.get_name() for task in running)
            log.warning(
                "task did not stop",
                extra={
                    "task": ", ".join(names[:NAMES_LOGGED]),
                    "count": len(names),
                    "within_s": within,
                },
            )
            return False
        if now >= next_send:
            for task in running:
                task.cancel()
            next_send = now + resend_delay(sent)
            sent += 1
        _, running = await asyncio.wait(running, timeout=min(left, next_send - now))
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the task's own failure was logged where it happened
    return True


async def thread_done(fut: concurrent.futures.Future[Any], within: float) -> bool:
    """Whether ``fut`` (set by a thread) is done within ``within`` seconds; never
    cancels it, and waits without a helper thread: ``asyncio.to_thread(thread.join)``
    left a non-daemon executor thread blocked on a stuck thread, and Python 3.11 waits
    for those at exit without a limit."""
    loop = asyncio.get_running_loop()
    woke: asyncio.Future[None] = loop.create_future()

    def done(_: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            loop.call_soon_threadsafe(_resolve, woke)

    fut.add_done_callback(done)
    try:
        await wait_for(woke, within)
    except TimeoutError:
        return False
    return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
