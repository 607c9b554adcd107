"""Running-turn handles: the cancel handle of one turn, and a closed session's id
reserved while the turns its close cancelled still end (contract.md §12.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class TurnHandle:
    """The cancel handle of one running turn.

    The executor runs inline in the thread worker's task (:meth:`execute`), not in
    a task of its own; :meth:`cancel` cancels that task while, and only while, the
    executor runs, and counts its cancellations so that a shutdown's cancellation
    of the same task is told apart and propagates.
    """

    session_id: str
    turn_id: str
    cancel_requested: bool = False
    finished: bool = False
    _task: asyncio.Task[Any] | None = None
    _cancels: int = 0

    @property
    def executing(self) -> bool:
        return self._task is not None

    def cancel(self) -> bool:
        """Cancel the turn; one not yet executing is cancelled before it starts."""
        if self.finished:
            return False
        self.cancel_requested = True
        if self._task is not None:
            self._task.cancel()
            self._cancels += 1
        return True

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
