"""The answering half of a connection the front keeps (``front.FrontProtocol``): its
parsed requests answered in order by one task, each reply's bytes, whether the
connection stays open after it, and the wait for a paused transport (an SSE
answer's writes, and the next request of a client that takes none of the answers
written for it: answering on buffered them all, as aiohttp's handler, which waits
for each answer's drain, does not).

:class:`Answers` is a base of ``FrontProtocol``, which sets its attributes and
gives the hooks (idle timer, abort, reading resumed); the SSE answer
(``front_wire.ChunkedStream``) sees it through ``front_wire.Conn``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import TYPE_CHECKING

from xwm_bridge.transport.exchange import Reply
from xwm_bridge.transport.front_wire import (
    ChunkedStream,
    Clock,
    Request,
    header_lines,
    status_line,
)

if TYPE_CHECKING:
    from xwm_bridge.transport.front_server import Front

log = logging.getLogger("xwm_bridge.http")

#: parsed requests waiting behind the one being answered, and their bodies' bytes;
#: more pause reading until half are answered
MAX_PIPELINED = 8
MAX_PIPELINED_BYTES = 1024 * 1024


class Answers:
    """The queue of a kept connection and its answers (see the module docstring)."""

    front: Front
    transport: asyncio.Transport | None
    lost: bool
    paused: bool
    close_after: bool  # finish the queued answers, then close
    queue: collections.deque[Request]
    task: asyncio.Task[None] | None
    _queued_bytes: int
    _reading_paused: bool
    _drained: asyncio.Future[None] | None

    # --- the hooks (``FrontProtocol``'s) ----------------------------------------------------

    def _arm_idle(self) -> None:
        """Answered all: the keep-alive idle time runs."""

    def _reading_resumed(self) -> None:
        """Reading, paused while too much was waiting, resumed."""

    def abort(self) -> None:
        """Close at once: an answer cannot be finished."""

    # --- answers ----------------------------------------------------------------------------

    async def _answer_queued(self) -> None:
        """The connection's task: answers its requests in order (owned by the
        connection; cancelled when it goes, bounded by Front.shutdown)."""
        try:
            while self.queue and not self.lost:
                if self.paused:  # the client takes no answers: answer no more until it does
                    await self._writable()  # (the queue fills and reading pauses meanwhile)
                    continue
                request = self.queue.popleft()
                self._queued_bytes -= request.size
                if (
                    self._reading_paused
                    and len(self.queue) < MAX_PIPELINED // 2
                    and self._queued_bytes < MAX_PIPELINED_BYTES // 2
                ):
                    self._reading_paused = False
                    if self.transport is not None:
                        self.transport.resume_reading()
                    self._reading_resumed()
                await self._answer(request)
        finally:
            self.task = None
            if not self.lost:
                self._after_answers()

    async def _answer(self, request: Request) -> None:
        reply = request.reply
        stream: ChunkedStream | None = None
        if reply is None:
            stream = ChunkedStream(self, request)
            body = b"".join(request.body)
            request.body, request.size = [], 0
            try:
                reply = await self.front.endpoint.answer(request, body, stream)
            except Exception:
                log.exception("rpc request failed")
                if stream.started:
                    self.abort()
                    return
                request.keep_alive = False
                reply = Reply(500, b"500 internal server error\n", {"Content-Type": "text/plain"})
        if reply is not None:
            self._write_reply(request, reply)
        elif stream is not None and not stream.ended:
            await stream.end()

    @property
    def clock(self) -> Clock:
        return self.front.clock

    def keep(self, request: Request) -> bool:
        """Whether the answer to ``request`` keeps the connection open: the client
        asked to, and no close is due after it (one due when the last queued answer
        is written: the ones queued before it still go out)."""
        closing = self.close_after or self.front.closing
        return request.keep_alive and not (closing and not self.queue)

    def closed_by(self, request: Request) -> None:
        """The answer to ``request`` said ``Connection: close``: nothing after it."""
        self.close_after = True
        self.queue.clear()
        self._queued_bytes = 0

    def _write_reply(self, request: Request, reply: Reply) -> None:
        if self.lost or self.transport is None:
            return
        keep = self.keep(request)
        if not keep:
            self.closed_by(request)
        body = reply.body
        answer = [
            status_line(reply.status),
            header_lines(reply.headers, request.cors),
            b"Content-Length: %d\r\n" % len(body),
            self.front.clock.line(),
            b"\r\n" if keep else b"Connection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(answer))

    def _after_answers(self) -> None:
        if self.close_after:
            self._maybe_close()
        else:
            self._arm_idle()

    def _maybe_close(self) -> None:
        if self.task is None and not self.queue and self.transport is not None:
            self.transport.close()

    # --- writes -----------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _writable(self) -> None:
        """Until writes resume or the connection goes (the send deadline aborts one
        whose writes stay paused)."""
        with contextlib.suppress(ConnectionResetError):
            await self.drain()

    async def drain(self) -> None:
        if self.lost:
            raise ConnectionResetError("client connection closed")
        if self.paused:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained
            if self.lost:
                raise ConnectionResetError("client connection closed")
