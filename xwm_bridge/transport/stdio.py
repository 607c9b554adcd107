"""``acp-stdio``: the bridge contract on stdin/stdout (contract.md §14).

Unlike the original, requests are handled concurrently, so ``session.cancel``
overtakes a running turn; responses carry their ids and may interleave.

At most ``inflight.MAX_INFLIGHT_PER_CONNECTION`` requests run at once. The
stream cannot refuse a request it has not read, so past the limit requests wait
in arrival order (at most ``MAX_WAITING``; then reading stops until a slot
frees). A cancel does not wait behind them: it starts at once, up to twice the
limit, so a client whose slots are all taken can still cancel its turns.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge import inflight, jsonrpc
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.core.context import CallContext
from xwm_bridge.framing import FramingError, StdioDecoder, decode_frame
from xwm_bridge.observability.rejections import MESSAGE_TOO_LARGE, decode_reason, reject
from xwm_bridge.tasks import Supervisor
from xwm_bridge.transport.notify import LiveConnection, OrderedSender
from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.stdio")
READ_CHUNK = 64 * 1024
#: chunks read from stdin that may wait for the server (then the reading thread waits)
PENDING_CHUNKS = 16
#: requests read past the in-flight limit and waiting for a slot; more stop reading
MAX_WAITING = 16


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
        self._waiting: collections.deque[jsonrpc.Request] = collections.deque()
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
            if isinstance(item, FramingError) and item.too_large:
                reason = MESSAGE_TOO_LARGE
            reject(self._dispatcher.metrics, "stdio", reason, error=detail[:200])
            await self._send(req)
            return
        cancel = req.method in inflight.CANCEL_METHODS
        if inflight.admits(len(self._inflight), req.method) and (cancel or not self._waiting):
            self._start(req)
            return
        self._waiting.append(req)
        while len(self._waiting) >= MAX_WAITING:  # stop reading until a slot frees
            await self._inflight.wait_any()

    def _start(self, req: jsonrpc.Request) -> None:
        task = self._inflight.spawn(self._serve_one(req), name=f"stdio-request:{req.method}")
        task.add_done_callback(self._start_waiting)

    def _start_waiting(self, _ended: asyncio.Task[Any]) -> None:
        """A request ended: start the ones waiting for its slot (not on shutdown)."""
        if self._inflight.closing:
            self._waiting.clear()
            return
        waiting = self._waiting
        while waiting and inflight.admits(len(self._inflight), waiting[0].method):
            self._start(waiting.popleft())

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


class StdinInput:
    """``fd`` read on a daemon thread (works for pipes, ttys and files alike); :meth:`read`
    is what a stdio server reads with, and :meth:`end` makes it return end of input now
    (a signal's shutdown: the server answers the requests still running, as at the
    real end of input, instead of being cancelled with them).

    A daemon thread, not the default executor: a read blocked on stdin must not keep
    the process alive at shutdown. At most :data:`PENDING_CHUNKS` chunks wait for the
    server; past that the thread waits (back-pressure on the writer of stdin)."""

    def __init__(self, fd: int = 0) -> None:
        self._loop = asyncio.get_running_loop()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._room = threading.Semaphore(PENDING_CHUNKS)
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        threading.Thread(target=self._pump, args=(fd,), name="stdin-reader", daemon=True).start()

    def _pump(self, fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except OSError:
                chunk = b""
            self._room.acquire()
            try:
                self._loop.call_soon_threadsafe(self._put, chunk)
            except RuntimeError:  # loop closed
                return
            if not chunk:
                return

    def _put(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def end(self) -> None:
        """From now on :meth:`read` returns ``b""`` (what is not read yet is dropped)."""
        self._ended = True
        self._wake()

    async def read(self) -> bytes:
        while not self._ended:
            if self._chunks:
                self._room.release()
                chunk = self._chunks.popleft()
                self._ended = not chunk  # the real end of input: nothing follows it
                return chunk
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return b""


def stdin_reader(fd: int = 0) -> Callable[[], Awaitable[bytes]]:
    """The read of a :class:`StdinInput` on ``fd``."""
    return StdinInput(fd).read


def stdout_writer(fd: int = 1) -> Callable[[bytes], Awaitable[None]]:
    """Write whole lines to ``fd`` from a worker thread, one line at a time.

    A cancelled write (its request was cancelled, its deadline passed) ends the
    awaiting task, not the thread: the thread lock, not the callers' asyncio
    locks (released on that cancellation), keeps the next line from being written
    into the middle of it."""
    one_line = threading.Lock()

    def write_all(data: bytes) -> None:
        with one_line:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]

    async def write(data: bytes) -> None:
        await asyncio.to_thread(write_all, data)

    return write
