"""The SSE answer to ``POST /acp/rpc`` with ``Accept: text/event-stream``.

:meth:`SseAnswers.answer` runs the call with a ``notify`` that writes each
message as an event (``notify_many``: the events of one upstream read in one
write), through one :class:`OrderedSender`, with a ``: keep-alive`` comment after
``limits.sse_keepalive`` seconds of silence; the reply is the last event and
leaves with the end of the answer. It writes to a :class:`StreamOut`: on a
connection aiohttp owns, :class:`AiohttpStream`; on one the front answers
(``front.py``), its chunked stream. The catch-up stream of
``/acp/sessions/{id}/events`` is ``events.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.config import Limits
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.sse import DONE, encode_data
from xwm_bridge.transport.exchange import SSE_KEEPALIVE, RequestView, StreamOut, sse_headers
from xwm_bridge.transport.http_checks import CallFactory, apply_cors
from xwm_bridge.transport.notify import OrderedSender
from xwm_bridge.wire import WireEncoder


class AiohttpStream:
    """:class:`StreamOut` on an aiohttp ``StreamResponse``."""

    def __init__(self, request: web.Request, cors: dict[str, str]) -> None:
        self.request = request
        headers = sse_headers(request.keep_alive)
        self.response = web.StreamResponse(status=200, headers=headers)
        apply_cors(self.response, cors)

    async def write(self, data: bytes, *, last: bool = False) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        if last:
            await self.response.write_eof(data)
        else:
            await self.response.write(data)

    async def end(self) -> None:
        if self.response.prepared:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.response.write_eof()


class SseAnswers:
    def __init__(
        self,
        dispatcher: Dispatcher,
        wire: WireEncoder,
        metrics: Metrics,
        limits: Limits,
        *,
        call: CallFactory,
    ) -> None:
        self.dispatcher = dispatcher
        self.wire = wire
        self.metrics = metrics
        self.limits = limits
        self._call = call

    async def answer(self, request: RequestView, req: jsonrpc.Request, stream: StreamOut) -> None:
        sent = self.metrics.sent.get("sse")
        loop = asyncio.get_running_loop()
        last_write = loop.time()
        final: bytes | None = None  # the final message carries the end of the answer

        async def write(data: bytes) -> None:
            nonlocal last_write
            await stream.write(data, last=data is final)
            last_write = loop.time()
            sent.inc(len(data))

        sender = OrderedSender(write, timeout=self.limits.notification_send_timeout)
        wire = self.wire

        async def notify(message: dict[str, Any]) -> None:
            data = wire.encode(message)
            if data is not None:
                await sender.send_bytes(encode_data(data))

        async def notify_many(messages: list[dict[str, Any]]) -> None:
            # the frames of one upstream read leave in one chunk: one write, not one each;
            # through the wire encoder (secrets redacted, never raises)
            data = wire.events(messages)
            if data:
                await sender.send_bytes(data)

        async def keepalive(interval: float) -> None:
            # a comment line after `interval` seconds of silence, so that proxies with
            # idle timeouts (60-100 s is common) do not cut a long, quiet turn
            while not sender.broken:
                idle = loop.time() - last_write
                if idle < interval:
                    await asyncio.sleep(interval - idle)
                    continue
                await sender.send_bytes(SSE_KEEPALIVE)

        call = self._call(request, notify, "sse", notify_many=notify_many)
        interval = self.limits.sse_keepalive
        if interval > 0:
            async with asyncio.TaskGroup() as group:  # the keep-alive ends with the call
                beat = group.create_task(keepalive(interval), name="sse-keepalive")
                try:
                    reply = await self.dispatcher.handle(req, call)
                finally:
                    beat.cancel()
        else:
            reply = await self.dispatcher.handle(req, call)
        encoded = None if reply is None else wire.encode(reply)
        final = DONE if encoded is None else encode_data(encoded)

        await sender.send_bytes(final)
        sender.close()
        await stream.end()
