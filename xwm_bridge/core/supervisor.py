"""Owner of every background task: spawned here, cancelled here on shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("xwm_bridge.tasks")
T = TypeVar("T")


class Supervisor:
    """A registry of tasks that outlive the call that started them.

    Each task is removed when it ends; an exception it raises is logged, never
    lost. :meth:`shutdown` waits up to a grace period, then cancels the rest.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closing(self) -> bool:
        return self._closing

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "background task failed",
                exc_info=task.exception(),
                extra={"task": task.get_name()},
            )

    def begin_shutdown(self) -> None:
        self._closing = True

    async def wait(self, within: float) -> bool:
        """Wait up to ``within`` seconds for every task (including ones spawned meanwhile)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self._tasks:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            await asyncio.wait(set(self._tasks), timeout=remaining)
        return True

    async def shutdown(self, grace: float) -> None:
        """Let tasks finish for ``grace`` seconds, then cancel and await the rest."""
        self._closing = True
        await self.wait(grace)
        pending = set(self._tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)
