"""``acp-stdio``: the bridge contract on stdin/stdout (contract.md §14).

Unlike the original, requests are handled concurrently, so ``session.cancel``
overtakes a running turn; responses carry their ids and may interleave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable

from xwm_bridge import jsonrpc
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.core.context import CallContext
from xwm_bridge.framing import FramingError, StdioDecoder, decode_frame
from xwm_bridge.tasks import Supervisor
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.transport.rejections import decode_reason, reject
from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.stdio")
MAX_INFLIGHT = 256
READ_CHUNK = 64 * 1024


class StdioServer:
    def __init__(
        self,
        dispatcher: Dispatcher,
        read: Callable[[], Awaitable[bytes]],
        write: Callable[[bytes], Awaitable[None]],
        *,
        max_message: int,
        send_timeout: float,
        wire: WireEncoder = PLAIN,
    ) -> None:
        self._dispatcher = dispatcher
        self._wire = wire
        self._read = read
        self._sender = OrderedSender(write, timeout=send_timeout)
        self._decoder = StdioDecoder(max_message=max_message)
        #: the stream owns its requests: they end with it
        self._inflight = Supervisor()
        # the stream lives as long as the process: gateway events may always use it
        self._live = LiveConnection(self._send)

    async def _send(self, message: dict[str, object]) -> None:
        data = self._wire.encode(message)
        if data is not None:
            await self._sender.send_bytes(data + b"\n")

    async def _serve_one(self, req: jsonrpc.Request) -> None:
        reply = await self._dispatcher.handle(
            req, CallContext(self._send, "stdio", "stdio", "", self._live, "stdio")
        )
        if reply is not None:
            await self._send(reply)

    async def _handle_frame(self, item: bytes | FramingError) -> None:
        req = decode_frame(item)
        if not isinstance(req, jsonrpc.Request):
            error = req.get("error")
            detail = str(error.get("message", "")) if isinstance(error, dict) else ""
            code = error.get("code", -32700) if isinstance(error, dict) else -32700
            reason = decode_reason(code if isinstance(code, int) else -32700)
            reject(self._dispatcher.metrics, "stdio", reason, error=detail[:200])
            await self._send(req)
            return
        while len(self._inflight) >= MAX_INFLIGHT:  # backpressure: stop reading
            await self._inflight.wait_any()
        self._inflight.spawn(self._serve_one(req), name=f"stdio-request:{req.method}")

    async def serve(self) -> None:
        """Read until end of input, then wait for every request still running."""
        try:
            while True:
                chunk = await self._read()
                items = self._decoder.feed(chunk) if chunk else self._decoder.eof()
                for item in items:
                    await self._handle_frame(item)
                if not chunk:
                    break
            self._live.closed = True  # long-lived requests (bridge.watch) end with the input
            await self._inflight.wait(None)
        finally:
            await self._inflight.shutdown(0)


def stdin_reader(fd: int = 0) -> Callable[[], Awaitable[bytes]]:
    """Read ``fd`` on a daemon thread (works for pipes, ttys and files alike).

    A daemon thread, not the default executor: a read blocked on stdin must not
    keep the process alive at shutdown.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)

    def pump() -> None:
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except OSError:
                chunk = b""
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except RuntimeError:  # loop closed
                return
            if not chunk:
                return

    threading.Thread(target=pump, name="stdin-reader", daemon=True).start()
    return queue.get


def stdout_writer(fd: int = 1) -> Callable[[bytes], Awaitable[None]]:
    def write_all(data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    async def write(data: bytes) -> None:
        await asyncio.to_thread(write_all, data)

    return write
