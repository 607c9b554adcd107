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
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str,
        service: bool = False,
        awaited: bool = False,
    ) -> asyncio.Task[T]:
        """``awaited``: the caller awaits the task and handles its failure, so it is not
        logged here as well (one that nobody retrieves is still reported, by asyncio's
        "exception was never retrieved" when the task is collected)."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        (self._services if service else self._tasks).add(task)
        task.add_done_callback(self._forget if awaited else self._done)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._services.discard(task)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._forget(task)
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


class Deadlines:
    """Deadlines of many blocks at once on one loop timer.

    ``with deadlines.within(s):`` in a task does what ``async with asyncio.timeout(s):``
    does (past ``s`` seconds the task is cancelled, the block raises ``TimeoutError``,
    the task's cancel count is left as it found it; a cancel from elsewhere stays a
    ``CancelledError``) without arming and cancelling a loop timer per block: that
    cost about 2 µs per upstream call on uvloop. Blocks of one length end their
    deadlines in the order they began (the loop's clock is monotonic), so each length
    keeps its open blocks in an insertion-ordered dict; the one timer is armed for the
    earliest first deadline, and when it fires it expires the blocks past theirs and
    is armed for the next. A block that ends leaves its dict (no timer call).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        #: block length → its open blocks, oldest (earliest deadline) first
        self._open: dict[float, dict[Within, None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def within(self, timeout: float) -> Within:
        return Within(self, timeout)

    def open_blocks(self) -> int:
        return sum(map(len, self._open.values()))

    def _add(self, loop: asyncio.AbstractEventLoop, block: Within) -> None:
        if loop is not self._loop:  # first use, or another loop: nothing carries over
            self._loop, self._open, self._timer = loop, {}, None
        blocks = self._open.get(block.timeout)
        if blocks is None:
            blocks = self._open[block.timeout] = {}
        blocks[block] = None
        if self._timer is None or block.deadline < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._arm(loop, block.deadline)

    def _remove(self, block: Within) -> None:
        blocks = self._open.get(block.timeout)
        if blocks is not None:
            blocks.pop(block, None)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._timer_at = when
        self._timer = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        earliest: float | None = None
        for timeout, blocks in list(self._open.items()):
            while blocks:
                block = next(iter(blocks))
                if block.deadline > now:
                    if earliest is None or block.deadline < earliest:
                        earliest = block.deadline
                    break
                del blocks[block]
                block.expire()
            if not blocks:
                del self._open[timeout]
        if earliest is not None:
            self._arm(loop, earliest)


class Within:
    """One block of :meth:`Deadlines.within` (a context manager, entered once)."""

    __slots__ = ("_cancelling", "_owner", "_task", "deadline", "expired", "timeout")

    def __init__(self, owner: Deadlines, timeout: float) -> None:
        self._owner = owner
        self.timeout = timeout
        self.deadline = 0.0
        self.expired = False
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0

    def __enter__(self) -> Within:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("Deadlines.within() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self.deadline = loop.time() + self.timeout
        self._owner._add(loop, self)
        return self

    def expire(self) -> None:
        assert self._task is not None
        self.expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: object,
    ) -> None:
        self._owner._remove(self)
        if self.expired:  # as asyncio.timeout: our cancel taken back, and said as such
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc


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
