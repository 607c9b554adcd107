"""Serialized, deadline-bounded delivery of outgoing messages to one client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.transport")


class OrderedSender:
    """Writes one message at a time; a write that misses its deadline breaks the sender.

    After a break (slow or gone client) further messages are dropped instead of
    blocking the turn that produces them.
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

    async def send_bytes(self, data: bytes) -> bool:
        async with self._lock:
            if self.broken:
                return False
            try:
                await asyncio.wait_for(self._write(data), self._timeout)
            except (TimeoutError, ConnectionError, RuntimeError, OSError) as exc:
                self.broken = True
                log.info(
                    "client stopped receiving; dropping its messages", extra={"error": repr(exc)}
                )
                return False
            return True

    async def send(self, message: dict[str, Any]) -> None:
        """Encode (secrets redacted; never raises) and send one message."""
        data = self._wire.encode(message)
        if data is not None:
            await self.send_bytes(data)


class LiveConnection:
    """A long-lived client connection: where out-of-request notifications may go."""

    def __init__(self, notify: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.notify = notify
        self.closed = False
