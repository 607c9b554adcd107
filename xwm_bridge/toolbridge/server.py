"""The toolbridge stdio loop: frames in (newline JSON or Content-Length), JSON lines out.

Unlike the original, requests run concurrently: at most
``toolbridge.max_concurrent_calls`` tool calls run at once, and past that up to
:data:`MAX_WAITING` more wait for a slot while the server reads on, so a long
tool call does not block ``ping`` or a ``notifications/cancelled`` that abandons
it. Only with that many requests unanswered does reading stop (backpressure).
Messages without an id get no output at all (adapters.md §2.1); ``"id": null`` is
an invalid request, answered (``protocol.decode``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

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
        self._decoder = StdioDecoder(max_message=max_message)
        #: tool calls running at once; a call waits for one in its own task
        self._slots = asyncio.Semaphore(cfg.max_concurrent_calls)
        #: requests unanswered (running or waiting); the reader waits for one of these
        self._admitted = asyncio.Semaphore(cfg.max_concurrent_calls + MAX_WAITING)
        self._inflight: dict[Any, asyncio.Task[None]] = {}
        self._tasks = Supervisor()  # one task per request in flight, bounded by _admitted

    async def _send(self, message: dict[str, Any]) -> None:
        data = self._wire.encode(message)
        if data is None:
            return
        async with self._write_lock:
            await self._write(data + b"\n")

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
            if task is not None:
                task.cancel()
            return True
        return req.method.startswith("notifications/")

    async def _serve_one(self, req: jsonrpc.Request) -> None:
        try:
            reply = await self.handle(req)
        except asyncio.CancelledError:
            return  # cancelled by the client: MCP sends no response
        if reply is not None:
            await self._send(reply)

    def _call_done(self, rid: Any, task: asyncio.Task[None]) -> None:
        """Free the request's admission and in-flight entry. A done callback, not a
        ``finally`` in the coroutine: a call cancelled before its first step (its cancel
        was in the same read) never runs its body, and its admission would leak."""
        self._admitted.release()
        if _trackable(rid) and self._inflight.get(rid) is task:
            del self._inflight[rid]

    async def _frame(self, item: bytes | FramingError) -> None:
        req = protocol.decode(item)
        if req is None:
            log.info("ignored a JSON-RPC response: the toolbridge sends no requests")
            return
        if not isinstance(req, jsonrpc.Request):
            await self._send(req)
            return
        if self._on_notification(req):
            return
        # backpressure: stop reading only with MAX_WAITING requests waiting past the
        # running calls (a wait for a call slot here kept a cancel from being read)
        await self._admitted.acquire()
        task = self._tasks.spawn(self._serve_one(req), name=f"mcp-call-{req.method}")
        task.add_done_callback(functools.partial(self._call_done, req.id))
        if _trackable(req.id):
            self._inflight[req.id] = task

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
