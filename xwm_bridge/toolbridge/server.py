"""The toolbridge stdio loop: frames in (newline JSON or Content-Length), JSON lines out.

Unlike the original, requests run concurrently: at most
``toolbridge.max_concurrent_calls`` tool calls run at once, and past that up to
:data:`MAX_WAITING` more wait for a slot while the server reads on, so a long
tool call does not block ``ping`` or a ``notifications/cancelled`` that abandons
it. Only with that many requests unanswered does reading stop (backpressure).
Messages without an id get no output at all (adapters.md §2.1); ``"id": null`` is
an invalid request, answered (``protocol.decode``).

A JSON-RPC batch (a JSON array) is served only when this connection's
``initialize`` negotiated a version that has batches (``protocol.BATCH_VERSIONS``),
else refused with one error. Served, each of its requests is admitted, tracked for
``notifications/cancelled`` and run like a request of its own; the answers (none
for its notifications or a cancelled request) go out together, one JSON array on
one line, when the last of them is ready, and nothing at all when there are none.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

from xwm_bridge import jsonrpc
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.framing import FramingError, StdioDecoder
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.tasks import Supervisor
from xwm_bridge.toolbridge import protocol
from xwm_bridge.toolbridge.tools import ToolError, chat, claude_review
from xwm_bridge.toolbridge.vault import vault_kv
from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.toolbridge")
Write = Callable[[bytes], Awaitable[None]]
T = TypeVar("T")
#: requests read past the running calls (tool calls waiting for a slot, or a ping);
#: with this many more unanswered, reading stops until one ends
MAX_WAITING = 16


class ToolbridgeServer:
    def __init__(
        self,
        cfg: ToolbridgeConfig,
        http: aiohttp.ClientSession,
        read: Callable[[], Awaitable[bytes]],
        write: Write,
        *,
        max_message: int,
        wire: WireEncoder = PLAIN,
        proxies: ProxySettings | None = None,
    ) -> None:
        self._cfg = cfg
        #: the forward proxies (xwm_bridge/proxy.py); ``http`` already honours them
        self._proxies = proxies
        self._wire = wire
        self._http = http
        self._read = read
        self._write = write
        self._write_lock = asyncio.Lock()
        #: a write failed (stdout closed): nothing more is written
        self._output_gone = False
        self._decoder = StdioDecoder(max_message=max_message)
        #: tool calls running at once; a call waits for one in its own task
        self._slots = asyncio.Semaphore(cfg.max_concurrent_calls)
        #: requests unanswered (running or waiting); the reader waits for one of these
        self._admitted = asyncio.Semaphore(cfg.max_concurrent_calls + MAX_WAITING)
        self._inflight: dict[Any, asyncio.Task[Any]] = {}
        self._tasks = Supervisor()  # one task per request in flight, bounded by _admitted
        #: most messages in one batch: at most as many requests as may be unanswered
        self.max_batch = cfg.max_concurrent_calls + MAX_WAITING
        #: the protocol version this connection's ``initialize`` negotiated
        self._version: str | None = None
        #: the task answering that ``initialize``, which no cancel may end (MCP)
        self._initialize: asyncio.Task[None] | None = None

    async def _send(self, message: dict[str, Any]) -> None:
        data = self._wire.encode(protocol.wire_ids(message))
        if data is None:
            return
        await self._put(data + b"\n")

    async def _send_batch(self, replies: list[dict[str, Any]]) -> None:
        """One JSON array of ``replies`` on one line; nothing when there are none
        (JSON-RPC 2.0: never an empty array). Each is encoded alone, so one that
        cannot be encoded is its own ``-32603`` stand-in (``wire``)."""
        encoded = (self._wire.encode(protocol.wire_ids(reply)) for reply in replies)
        parts = [data for data in encoded if data is not None]
        if not parts:
            return
        await self._put(b"[" + b",".join(parts) + b"]\n")

    async def _put(self, line: bytes) -> None:
        """Write one line; once stdout is gone (the client died: EPIPE), drop the
        rest, said once (each answer was an error log line with a traceback)."""
        async with self._write_lock:
            if self._output_gone:
                return
            try:
                await self._write(line)
            except OSError as exc:
                self._output_gone = True
                log.info("client stopped reading; dropping replies", extra={"error": repr(exc)})

    async def handle(self, req: jsonrpc.Request) -> dict[str, Any] | None:
        """One request → its response (``None`` for a notification)."""
        try:
            value = await self._dispatch(req)
            response = jsonrpc.result(req.id, value)
        except RpcError as exc:
            response = jsonrpc.error(req.id, exc.code, exc.message)
        except Exception:
            log.exception("toolbridge method failed", extra={"method": req.method})
            response = jsonrpc.error(req.id, jsonrpc.INTERNAL_ERROR, "internal error")
        return None if req.is_notification else response

    async def _dispatch(self, req: jsonrpc.Request) -> dict[str, Any]:
        method, params = req.method, req.params
        if method == "initialize":
            return protocol.initialize_result(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return protocol.tools_list_result()
        if method == "tools/call":
            return await self.call_tool(protocol.ToolCall.parse(params))
        raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"unknown method: {method}")

    async def call_tool(self, call: protocol.ToolCall) -> dict[str, Any]:
        async with self._slots:
            return await self._run_tool(call)

    async def _run_tool(self, call: protocol.ToolCall) -> dict[str, Any]:
        started = asyncio.get_running_loop().time()
        try:
            if call.name == "chat":
                text = await chat(self._http, self._cfg, call.arguments)
            elif call.name == "claude_review":
                text = await claude_review(self._cfg, call.arguments)
            else:
                text = await vault_kv(self._cfg, call.arguments, self._proxies)
        except ToolError as exc:
            outcome, result = "error", protocol.tool_error(str(exc))
        else:
            outcome, result = "ok", protocol.tool_result(text)
        log.info(
            "tool call",
            extra={
                "tool": call.name,
                "outcome": outcome,
                "duration_ms": round((asyncio.get_running_loop().time() - started) * 1000, 1),
            },
        )
        return result

    def _on_notification(self, req: jsonrpc.Request) -> bool:
        """Handle the notifications we act on; True when consumed.

        A message with an id is a request whatever its method (MCP: notifications
        MUST NOT include an id) and must be answered: ``notifications/cancelled`` with
        an id went unanswered (and cancelled). It is dispatched like any other, so it
        gets ``-32601 unknown method: …`` and, malformed, cancels nothing."""
        if not req.is_notification:
            return False
        if req.method == "notifications/cancelled":
            rid = protocol.request_id_of_cancel(req.params)
            task = self._inflight.get(rid) if _trackable(rid) else None
            # MCP: the initialize request MUST NOT be cancelled; cancelled, it went
            # unanswered with its version recorded, so a retry was refused
            if task is not None and task is not self._initialize:
                task.cancel()
            return True
        return req.method.startswith("notifications/")

    async def _answer(self, req: jsonrpc.Request) -> dict[str, Any] | None:
        try:
            return await self.handle(req)
        except asyncio.CancelledError:
            return None  # cancelled by the client: MCP sends no response

    async def _serve_one(self, req: jsonrpc.Request) -> None:
        reply = await self._answer(req)
        # the id is free once its answer is on its way: a client reusing it as soon
        # as the answer arrives is not refused while this write has yet to return
        self._release(req.id, asyncio.current_task())
        if reply is not None:
            await self._send(reply)

    def _release(self, rid: Any, task: asyncio.Task[Any] | None) -> None:
        if _trackable(rid) and self._inflight.get(rid) is task:
            del self._inflight[rid]

    def _call_done(self, rid: Any, held: bool, task: asyncio.Task[None]) -> None:
        """Free the request's admission (unless ``held``: a batch's, given back once
        the batch's array is written) and in-flight entry. A done callback, not a
        ``finally`` in the coroutine: a call cancelled before its first step (its cancel
        was in the same read) never runs its body, and its admission would leak."""
        if not held:
            self._admitted.release()
        self._release(rid, task)

    def _batch_done(self, admissions: int, _task: asyncio.Task[None]) -> None:
        """Give back a batch's admissions once its array is written (or the batch
        ended otherwise): until then its requests are unanswered, and a client that
        does not read stdout must stop the reading (backpressure), as with a request
        of its own, whose admission is held through its write."""
        for _ in range(admissions):
            self._admitted.release()

    def _in_use(self, req: jsonrpc.Request) -> dict[str, Any] | None:
        """The refusal of a request whose id is that of one still in flight (MCP: a
        request id MUST NOT have been used before in the session), else ``None``. It
        replaced the running request's entry, so a cancel reached the wrong call, and
        both were answered under the one id."""
        if _trackable(req.id) and req.id in self._inflight:
            return jsonrpc.error(req.id, jsonrpc.INVALID_REQUEST, protocol.ID_IN_USE)
        return None

    async def _admit(
        self, req: jsonrpc.Request, coro: Coroutine[Any, Any, T], *, held: bool = False
    ) -> asyncio.Task[T]:
        """Run ``coro``, serving ``req``, in a task of its own once admitted; ``held``:
        its admission outlives the task (a batch's, :meth:`_batch_done`)."""
        # backpressure: stop reading only with MAX_WAITING requests waiting past the
        # running calls (a wait for a call slot here kept a cancel from being read)
        try:
            await self._admitted.acquire()
        except BaseException:
            coro.close()
            raise
        task = self._tasks.spawn(coro, name=f"mcp-call-{req.method}")
        task.add_done_callback(functools.partial(self._call_done, req.id, held))
        if _trackable(req.id):
            self._inflight[req.id] = task
        return task

    async def _frame(self, item: bytes | FramingError) -> None:
        req = protocol.decode(item)
        if isinstance(req, protocol.Batch):
            await self._batch(req)
            return
        if req is None:
            log.info("ignored a JSON-RPC response: the toolbridge sends no requests")
            return
        if not isinstance(req, jsonrpc.Request):
            await self._send(req)
            return
        if self._on_notification(req):
            return
        refusal = self._in_use(req)
        if refusal is not None:
            await self._send(refusal)
            return
        if req.method == "initialize" and not req.is_notification:
            if self._version is not None:
                await self._send(protocol.reinitialize_refusal(req.id, self._version))
                return
            # in the order read: a batch read after it is judged by its answer
            self._version = protocol.negotiate(req.params)
            self._initialize = await self._admit(req, self._serve_one(req))
            return
        await self._admit(req, self._serve_one(req))

    async def _batch(self, batch: protocol.Batch) -> None:
        """Serve a batch, or answer its refusal; one array answers it (``_gather``)."""
        refusal = protocol.batch_refusal(batch, self._version, self.max_batch)
        if refusal is not None:
            await self._send(refusal)
            return
        answers: list[dict[str, Any] | asyncio.Task[dict[str, Any] | None]] = []
        for message in protocol.batch_messages(batch):
            if message is None:
                log.info("ignored a JSON-RPC response: the toolbridge sends no requests")
            elif not isinstance(message, jsonrpc.Request):
                answers.append(message)
            elif self._on_notification(message):
                pass
            elif (refusal := self._in_use(message)) is not None:
                answers.append(refusal)  # the running request keeps its id
            else:
                answers.append(await self._admit(message, self._answer(message), held=True))
        admissions = sum(isinstance(answer, asyncio.Task) for answer in answers)
        if admissions:
            gather = self._tasks.spawn(self._gather(answers), name="mcp-batch")
            gather.add_done_callback(functools.partial(self._batch_done, admissions))
        else:
            await self._send_batch([a for a in answers if not isinstance(a, asyncio.Task)])

    async def _gather(
        self, answers: list[dict[str, Any] | asyncio.Task[dict[str, Any] | None]]
    ) -> None:
        """The batch's answers, in its order, once every request in it has ended: a
        request cancelled (even before it started) or a notification has none."""
        await asyncio.wait([a for a in answers if isinstance(a, asyncio.Task)])
        replies: list[dict[str, Any]] = []
        for answer in answers:
            if not isinstance(answer, asyncio.Task):
                replies.append(answer)
            elif not answer.cancelled() and answer.exception() is None:
                reply = answer.result()
                if reply is not None:
                    replies.append(reply)
        await self._send_batch(replies)

    async def serve(self) -> None:
        """Read until end of input, then let running calls finish."""
        try:
            while True:
                chunk = await self._read()
                for item in self._decoder.feed(chunk) if chunk else self._decoder.eof():
                    await self._frame(item)
                if not chunk:
                    break
            await self._tasks.wait(None)
        finally:
            await self._tasks.shutdown(0)


def _trackable(rid: Any) -> bool:
    return isinstance(rid, (str, int, float)) and not isinstance(rid, bool)
