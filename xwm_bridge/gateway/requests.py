"""A runtime's requests on its socket (gateway.md §5.1, §5.3): ids, the pending map,
serialized writes, one deadline per request, and responses matched by id.

The pending map holds one future per request in flight; each is removed when its
request ends (answered, failed, timed out, cancelled), and a lost socket fails
them all at once with the reason (``SOCKET_CLOSED``, ``SOCKET_RESET``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.protocol import GatewayError


class Requests:
    def __init__(self) -> None:
        self.ids = p.RequestIds(lambda: time.time_ns() // 1000)
        self._pending: dict[str, asyncio.Future[p.ResponseFrame]] = {}
        self._send_lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._pending)

    def deliver(self, frame: p.ResponseFrame) -> bool:
        """Hand a ``res`` to its request; False when none waits for it (an unknown or
        duplicate id, or a request that already gave up)."""
        fut = self._pending.pop(frame.id, None)
        if fut is None or fut.done():
            return False
        fut.set_result(frame)
        return True

    def fail_all(self, error: GatewayError) -> None:
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)

    async def call(
        self, ws: ClientConnection, method: str, params: dict[str, Any] | None, deadline_s: float
    ) -> p.ResponseFrame:
        """Write one request and wait for its ``res``, all within ``deadline_s`` seconds (waiting
        behind another request's write included); raise :class:`GatewayError`."""
        rid = self.ids.next()
        fut: asyncio.Future[p.ResponseFrame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            async with asyncio.timeout(deadline_s):
                async with self._send_lock:
                    # not sent when the socket was lost while this waited for its turn
                    if not fut.done():
                        await _send(ws, p.encode_request(rid, method, params), fut)
                return await fut
        except TimeoutError:
            lost = fut.exception() if fut.done() and not fut.cancelled() else None
            if lost is not None:
                raise lost from None  # the lost socket, not the deadline
            raise GatewayError(f"{method} request timeout", "RPC_TIMEOUT") from None
        finally:
            self._pending.pop(rid, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: a failed future is no "never retrieved" error


async def _send(ws: ClientConnection, data: bytes, fut: asyncio.Future[p.ResponseFrame]) -> None:
    try:
        await ws.send(data, text=True)  # a text frame: gateways may ignore binary ones
    except (OSError, websockets.WebSocketException) as exc:
        if not fut.done():  # else the lost socket's error (awaited next) says why
            raise GatewayError(str(exc) or type(exc).__name__, "SOCKET_FAILURE") from None
