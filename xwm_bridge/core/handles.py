"""Running-turn handles: the cancel handle of one turn, and a closed session's id
reserved while the turns its close cancelled still end (contract.md §12.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: seconds from a turn's cancel to its first re-send while its executor has not taken
#: it: an ``async with`` exit (or other cleanup) of up to this long that runs before the
#: executor's :func:`cancel_arrived` is never cut short
RESEND = 1.0
#: the longest interval between two later sends (each interval doubles up to it)
RESEND_MAX = 2.0
#: at most this many more sends (1, 3, 5, ... 19 s after the cancel): a cancel is lost
#: only when it lands in the iteration a third-party ``wait_for`` completes in, rarely
#: twice in a row
RESENDS = 10
#: the executing tasks whose turn's cancel is being sent again, by task: only turns
#: cancelled while executing, each until its executor ends or takes the cancel
_RESENDING: dict[asyncio.Task[Any], TurnHandle] = {}


def resend_delay(sent: int) -> float:
    """Seconds from the ``sent``-th send of a turn's cancel (0: the cancel itself) to
    the next: :data:`RESEND`, then twice the interval before, at most :data:`RESEND_MAX`."""
    return min(RESEND * 2.0**sent, RESEND_MAX)


def cancel_arrived() -> None:
    """Say, in the current task, that the turn's cancel has arrived.

    Call it first in an ``except CancelledError`` of an executor that goes on awaiting
    before it re-raises (the upstream cancel, the agent's answer): :class:`TurnHandle`
    sends a turn's cancel again until the executor ends (one can be lost in a
    third-party ``asyncio.wait_for``), and a cancel sent again would cut such a
    cleanup short. Nothing happens in a task with no such turn."""
    task = asyncio.current_task()
    handle = _RESENDING.get(task) if task is not None else None
    if handle is not None:
        handle._end_resend()


@dataclass(slots=True, eq=False)
class TurnHandle:
    """The cancel handle of one running turn.

    The executor runs inline in the thread worker's task (:meth:`execute`), not in
    a task of its own; :meth:`cancel` cancels that task while, and only while, the
    executor runs, and counts its cancellations so that a shutdown's cancellation
    of the same task is told apart and propagates.

    One cancel can be lost: CPython 3.11's ``asyncio.wait_for`` (redis-py's command
    writes, aiohttp, websockets) returns the inner result and drops a cancel of its
    caller landing in the same loop iteration, and the turn ran to its end. So once
    cancelled, the task is cancelled again, first after :data:`RESEND` (1 s), then at
    growing intervals (:func:`resend_delay`), at most :data:`RESENDS` times, until the
    executor ends or says the cancel arrived (:func:`cancel_arrived`); each send is
    counted. An uncancelled turn has no timer. The grace keeps a cleanup that runs
    before the executor can say so (an ``async with`` exit closing a stream) whole up
    to 1 s: a swallowed cancel and an unwinding executor look alike from outside
    (``task.cancelling()`` stays up in both; see :func:`xwm_bridge.tasks.stop`).
    """

    session_id: str
    turn_id: str
    cancel_requested: bool = False
    finished: bool = False
    _task: asyncio.Task[Any] | None = None
    _cancels: int = 0
    #: the next re-send of the cancel, while one is due
    _resend: asyncio.TimerHandle | None = None
    _resends: int = 0

    @property
    def executing(self) -> bool:
        return self._task is not None

    def cancel(self) -> bool:
        """Cancel the turn; one not yet executing is cancelled before it starts."""
        if self.finished:
            return False
        self.cancel_requested = True
        task = self._task
        if task is not None:
            task.cancel()
            self._cancels += 1
            if self._resend is None and self._resends < RESENDS:
                _RESENDING[task] = self
                self._resend = task.get_loop().call_later(resend_delay(0), self._send_again)
        return True

    def _send_again(self) -> None:
        self._resend = None
        task = self._task
        if task is None or self._resends >= RESENDS:
            self._end_resend()
            return
        self._resends += 1
        task.cancel()
        self._cancels += 1
        delay = resend_delay(self._resends)
        self._resend = task.get_loop().call_later(delay, self._send_again)

    def _end_resend(self) -> None:
        """No more sends of the cancel: the executor ended or has taken it."""
        if self._resend is not None:
            self._resend.cancel()
            self._resend = None
        self._resends = RESENDS  # a later cancel() of this turn is sent once
        if self._task is not None:
            _RESENDING.pop(self._task, None)

    async def execute(
        self,
        run: Callable[[], Awaitable[T]],
        on_cancel: Callable[[], Awaitable[T]],
    ) -> T:
        """``run()`` in the current task, interruptible by :meth:`cancel`; a client
        cancel (before or during the run) gives ``on_cancel()`` instead. Any other
        cancellation of the task (shutdown) propagates."""
        if self.cancel_requested:
            self.finished = True
            return await on_cancel()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        try:
            result = await run()
        except asyncio.CancelledError:
            if not (self._cancels and task.cancelling() <= self._cancels):
                raise  # not (only) ours: shutdown
            interrupted = True
        else:
            interrupted = False
        finally:
            if self._resend is not None:  # cancelled turns only
                self._end_resend()
            self._task = None
            self.finished = True
            if task.cancelling() <= self._cancels:
                for _ in range(min(self._cancels, task.cancelling())):
                    task.uncancel()  # ours, consumed here (the executor may have swallowed it)
        if interrupted:
            return await on_cancel()
        return result


@dataclass(slots=True, eq=False)
class Closing:
    """A closed session's id while the turns the close cancelled are still ending."""

    #: the cancelled turns not ended yet (one session may run turns on several threads)
    handles: list[TurnHandle]
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: turns for the id waiting for it (:meth:`SessionRegistry.until_closed`)
    waiters: int = 0
