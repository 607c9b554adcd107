"""Per-thread FIFO queues (contract.md §12.2), bounded and self-reaping.

Turns of one thread run one at a time in arrival order; different threads run
in parallel. Fixes of the original: at most ``max_depth`` turns may wait on a
thread (overflow is refused at once with :class:`QueueFullError`), a queue and
its worker disappear as soon as the thread is idle, and a turn whose caller
went away before it started is skipped. A caller that cancels a turn still
waiting takes it off the queue at once (:meth:`ThreadQueues.withdraw`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.tasks import Supervisor

Job = Callable[[], Awaitable[Any]]


class QueueFullError(Exception):
    def __init__(self, thread_id: str, depth: int) -> None:
        super().__init__(
            f"thread queue is full: {depth} turns already waiting on thread {thread_id}; "
            "retry when one finishes"
        )
        self.thread_id = thread_id
        self.depth = depth


class ShuttingDownError(Exception):
    """The bridge is draining: this turn will not start."""


class WithdrawnError(Exception):
    """The caller cancelled this turn while it waited in its thread's queue: it never ran."""


@dataclass(slots=True)
class _Thread:
    waiting: deque[tuple[Job, asyncio.Future[Any]]] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    running: bool = False


class ThreadQueues:
    def __init__(self, supervisor: Supervisor, *, max_depth: int = 32) -> None:
        self._supervisor = supervisor
        self._max_depth = max_depth
        self._threads: dict[str, _Thread] = {}
        self._closed = False

    def __len__(self) -> int:
        """Threads with a running or waiting turn."""
        return len(self._threads)

    def depth(self, thread_id: str) -> int:
        th = self._threads.get(thread_id)
        return len(th.waiting) if th else 0

    def threads(self) -> list[str]:
        """Threads with a running or waiting turn."""
        return list(self._threads)

    def total_waiting(self) -> int:
        return sum(len(th.waiting) for th in self._threads.values())

    def check_capacity(self, thread_id: str) -> None:
        """Raise :class:`QueueFullError` if a turn submitted now would have to wait behind
        ``max_depth`` others. A turn that can start at once is always accepted."""
        th = self._threads.get(thread_id)
        if th is None:
            return
        # Not running yet means the worker is about to start the first queued job.
        ahead = len(th.waiting) if th.running else len(th.waiting) - 1
        if ahead >= self._max_depth:
            raise QueueFullError(thread_id, self._max_depth)

    def close(self) -> int:
        """Refuse new turns and fail every waiting one with :class:`ShuttingDownError`.

        Running turns are not touched (the caller drains or cancels them).
        Returns how many waiting turns were refused.
        """
        self._closed = True
        refused = 0
        for th in self._threads.values():
            for _, fut in th.waiting:
                if not fut.done():
                    fut.set_exception(ShuttingDownError())
                    refused += 1
            th.waiting.clear()
        return refused

    async def submit(self, thread_id: str, job: Job) -> Any:
        """Run ``job`` after every earlier job of ``thread_id``; return its result."""
        return await self.submit_nowait(thread_id, job)

    def submit_nowait(self, thread_id: str, job: Job) -> asyncio.Future[Any]:
        """Queue ``job`` now (its place is fixed before this returns); the future
        resolves to its result."""
        if self._closed:
            raise ShuttingDownError()
        self.check_capacity(thread_id)
        th = self._threads.get(thread_id)
        if th is None:
            th = self._threads[thread_id] = _Thread()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        th.waiting.append((job, fut))
        if th.worker is None:
            th.worker = self._supervisor.spawn(
                self._work(thread_id, th), name=f"thread:{thread_id}"
            )
        return fut

    def withdraw(self, thread_id: str, fut: asyncio.Future[Any]) -> bool:
        """Take the job of ``fut`` (from :meth:`submit_nowait`) off ``thread_id``'s queue
        if it is still waiting, and cancel ``fut``. False when it started (or ended): a
        turn that runs is stopped by its own cancel, not here."""
        th = self._threads.get(thread_id)
        if th is None:
            return False
        for i, (_, waiting) in enumerate(th.waiting):
            if waiting is fut:
                del th.waiting[i]
                fut.cancel()
                return True
        return False

    async def _work(self, thread_id: str, th: _Thread) -> None:
        try:
            while th.waiting:
                job, fut = th.waiting.popleft()
                if fut.done():  # the caller gave up before the turn started
                    continue
                th.running = True
                try:
                    value = await job()
                except asyncio.CancelledError:
                    fut.cancel()
                    raise
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(value)
                finally:
                    th.running = False
        finally:
            # No await between the emptiness check above and this removal, so a
            # concurrent submit either lands before (and is run) or finds no worker.
            if self._threads.get(thread_id) is th:
                del self._threads[thread_id]
            for _, fut in th.waiting:
                fut.cancel()
            th.waiting.clear()
