"""Serialized, deadline-bounded delivery of outgoing messages to one client."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.transport")


class OrderedSender:
    """Writes one message at a time; a write that misses its deadline breaks the sender.

    After a break (slow or gone client) further messages are dropped instead of
    blocking the turn that produces them.

    The deadline costs no timer per message: one watchdog timer per sender, armed
    by a write when none is pending and re-armed only while writes go on, cancels
    the write in progress once it has taken ``timeout`` seconds. It holds the
    sender weakly, so a finished response is not kept alive until it fires.
    """

    def __init__(
        self,
        write: Callable[[bytes], Awaitable[None]],
        *,
        timeout: float,
        wire: WireEncoder = PLAIN,
    ) -> None:
        self._write = write
        self._timeout = timeout
        self._wire = wire
        self._lock = asyncio.Lock()
        self.broken = False
        #: the task in the middle of a write, and when that write began
        self._writer: asyncio.Task[Any] | None = None
        self._since = 0.0
        self._watchdog: asyncio.TimerHandle | None = None
        self._expired = False

    async def send_bytes(self, data: bytes) -> bool:
        async with self._lock:
            if self.broken:
                return False
            loop = asyncio.get_running_loop()
            self._writer = asyncio.current_task()
            self._since = now = loop.time()
            if self._watchdog is None:
                self._watchdog = loop.call_at(now + self._timeout, _watch, weakref.ref(self))
            try:
                await self._write(data)
            except asyncio.CancelledError:
                if not self._expired:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # our deadline, not the caller's cancellation
                self._broke(TimeoutError(f"no progress for {self._timeout:g}s"))
                return False
            except (ConnectionError, RuntimeError, OSError) as exc:
                self._broke(exc)
                return False
            finally:
                self._writer = None
            return True

    def _broke(self, exc: BaseException) -> None:
        self.broken = True
        log.info("client stopped receiving; dropping its messages", extra={"error": repr(exc)})

    def _check(self) -> None:
        self._watchdog = None
        writer = self._writer
        if writer is None:
            return  # idle: the next write arms it again
        due = self._since + self._timeout
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self._expired = True
            writer.cancel()
        else:
            self._watchdog = loop.call_at(due, _watch, weakref.ref(self))

    async def send(self, message: dict[str, Any]) -> None:
        """Encode (secrets redacted; never raises) and send one message."""
        data = self._wire.encode(message)
        if data is not None:
            await self.send_bytes(data)

    def close(self) -> None:
        """The connection is done: its watchdog timer goes now, not when it fires."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()


def _watch(ref: weakref.ref[OrderedSender]) -> None:
    sender = ref()
    if sender is not None:
        sender._check()


class LiveConnection:
    """A long-lived client connection: where out-of-request notifications may go."""

    def __init__(self, notify: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.notify = notify
        self.closed = False
