"""A fake upstream ACP provider for tests and benchmarks (not shipped).

Speaks the bridge-protocol methods over ``POST /acp/rpc`` (plain JSON, or SSE
when the request accepts ``text/event-stream``) and ``GET /acp`` (WebSocket).
A turn replies ``echo: <taskPrompt>``, streamed as ``chunks`` ``session.update``
notifications carrying ``delta`` pieces, after ``latency_ms``.

Directives at the start of ``taskPrompt`` change one turn:

* ``slow:<ms>``     sleep that long before answering (cancellable by ``session.cancel``)
* ``drip:<ms>``     stream the chunks that far apart (output that visibly grows)
* ``error``         answer a JSON-RPC error ``{"code":-32000,"message":"fake upstream error"}``
* ``malformed``     answer a body that is not JSON
* ``status:<n>``    answer HTTP status n with a plain-text body
* ``nullresult``    answer ``"result": null``
* ``hang``          never answer (until cancelled or the client goes away)

``GET /_state`` returns what the fake saw (requests, cancels, headers, params);
``POST /_reset`` clears it. In-process tests can also hold a session's turns:
``state.holds[session_id] = asyncio.Event()`` makes each of its turns wait (after it
shows in ``state.active``, before its latency) until the event is set or the turn is
cancelled; ``state.cancel_holds[session_id] = asyncio.Event()`` answers that session's
``session.cancel`` only once the event is set (the bridge's turn stays in its
cancellation meanwhile); ``state.paces[session_id] = Pace()`` sends each chunk of its
turns only when the test grants it (``Pace.step``), so a test knows what was streamed
when.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from internal.peers.serving import serve_forever

_DIRECTIVE = re.compile(
    r"^(slow:(\d+)|drip:(\d+)|error|malformed|status:(\d{3})|nullresult|hang)\b\s*"
)


class Pace:
    """Chunks one at a time, as the test grants them (no timing involved)."""

    def __init__(self) -> None:
        self._permits = asyncio.Semaphore(0)
        self.granted = 0
        self.opened = False

    def step(self, n: int = 1) -> None:
        self.granted += n
        for _ in range(n):
            self._permits.release()

    def open(self) -> None:
        """Every chunk from now on goes at once."""
        self.opened = True
        self._permits.release()

    async def wait(self, cancel: asyncio.Event) -> None:
        """Until a chunk may go, or the turn is cancelled."""
        permit = asyncio.ensure_future(self._permits.acquire())
        stop = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({permit, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not permit.done():
                permit.cancel()
            elif self.opened:
                self._permits.release()  # open: the next chunk finds a permit too


@dataclass
class FakeState:
    latency_ms: float = 0.0
    chunks: int = 3
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancels: list[dict[str, Any]] = field(default_factory=list)
    active: dict[str, asyncio.Event] = field(default_factory=dict)
    #: session id → turns of that session wait until it is set (tests' event, not a sleep)
    holds: dict[str, asyncio.Event] = field(default_factory=dict)
    #: session id → its ``session.cancel`` is answered once it is set (the turn it cancels
    #: is told at once)
    cancel_holds: dict[str, asyncio.Event] = field(default_factory=dict)
    #: session id → its turns' chunks go one per ``Pace.step`` (see :class:`Pace`)
    paces: dict[str, Pace] = field(default_factory=dict)
    completed: int = 0
    cancelled_turns: int = 0
    keep_requests: int = 1000

    def record(
        self, method: str, params: dict[str, Any], headers: dict[str, str], transport: str
    ) -> None:
        self.requests.append(
            {"method": method, "params": params, "headers": headers, "transport": transport}
        )
        del self.requests[: -self.keep_requests]

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "cancels": self.cancels,
            "active": sorted(self.active),
            "completed": self.completed,
            "cancelledTurns": self.cancelled_turns,
        }


STATE_KEY = web.AppKey("state", FakeState)


def _parse_prompt(prompt: str) -> tuple[str, str]:
    m = _DIRECTIVE.match(prompt)
    return (m.group(1), prompt[m.end() :]) if m else ("", prompt)


async def _turn(
    state: FakeState,
    rid: Any,
    params: dict[str, Any],
    emit: Any,
) -> tuple[dict[str, Any] | None, bytes | None, int]:
    """Run one fake turn. Returns (envelope, raw_body, http_status)."""
    session_id = str(params.get("sessionId", ""))
    prompt = str(params.get("taskPrompt", ""))
    directive, text = _parse_prompt(prompt)
    turn_id = f"turn-fake-{time.time_ns()}"
    cancel = asyncio.Event()
    state.active[session_id] = cancel
    try:
        hold = state.holds.get(session_id)
        if hold is not None:
            await _first(hold, cancel)
        delay = state.latency_ms / 1000
        if directive.startswith("slow:"):
            delay = int(directive[5:]) / 1000
        if directive == "hang":
            delay = 3600.0
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cancel.wait(), delay)
        if cancel.is_set():
            state.cancelled_turns += 1
            return (
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "result": {"success": False, "error": "cancelled", "turnId": turn_id},
                },
                None,
                200,
            )
        if directive == "malformed":
            return None, b"<html>not json", 200
        if directive.startswith("status:"):
            return None, b"upstream exploded", int(directive[7:])
        if directive == "error":
            return (
                {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "error": {"code": -32000, "message": "fake upstream error"},
                },
                None,
                200,
            )
        if directive == "nullresult":
            return {"jsonrpc": "2.0", "id": rid, "result": None}, None, 200
        output = f"echo: {text}"
        n = max(1, state.chunks)
        size = max(1, -(-len(output) // n))
        pieces = [output[i : i + size] for i in range(0, len(output), size)]
        gap = int(directive[5:]) / 1000 if directive.startswith("drip:") else 0.0
        pace = state.paces.get(session_id)
        for seq, piece in enumerate(pieces, 1):
            if pace is not None:
                await pace.wait(cancel)
            if gap and seq > 1:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cancel.wait(), gap)
            if cancel.is_set() and (pace is not None or (gap and seq > 1)):
                state.cancelled_turns += 1
                result = {"success": False, "error": "cancelled", "turnId": turn_id}
                return {"jsonrpc": "2.0", "id": rid, "result": result}, None, 200
            await emit(
                {
                    "jsonrpc": "2.0",
                    "method": "session.update",
                    "params": {
                        "sessionId": session_id,
                        "turnId": turn_id,
                        "seq": seq,
                        "type": "delta",
                        "delta": piece,
                    },
                }
            )
        state.completed += 1
        result = {
            "success": True,
            "output": output,
            "turnId": turn_id,
            "provider": "fake",
            "mode": "single-agent",
        }
        return {"jsonrpc": "2.0", "id": rid, "result": result}, None, 200
    finally:
        if state.active.get(session_id) is cancel:
            del state.active[session_id]


async def _first(*events: asyncio.Event) -> None:
    """Wait until one of ``events`` is set."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _handle_cancel(state: FakeState, rid: Any, params: dict[str, Any]) -> dict[str, Any]:
    state.cancels.append(params)
    session_id = str(params.get("sessionId", ""))
    event = state.active.get(session_id)
    if event is not None:
        event.set()
    hold = state.cancel_holds.get(session_id)
    if hold is not None:
        await hold.wait()
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"accepted": True, "cancelled": event is not None},
    }


def _capabilities(rid: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": {"singleAgent": True, "providerCatalog": []}}


async def rpc(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        req = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return web.json_response(
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "bad json"}}
        )
    method, rid, params = req.get("method"), req.get("id"), req.get("params") or {}
    state.record(method, params, dict(request.headers), "http")
    if method == "session.cancel":
        return web.json_response(await _handle_cancel(state, rid, params))
    if method == "acp.capabilities":
        return web.json_response(_capabilities(rid))
    streaming = "text/event-stream" in request.headers.get("Accept", "")
    stream: web.StreamResponse | None = None

    async def emit(message: dict[str, Any]) -> None:
        nonlocal stream
        if not streaming:
            return
        if stream is None:
            stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await stream.prepare(request)
        await stream.write(b"data: " + orjson.dumps(message) + b"\n\n")

    envelope, raw, status = await _turn(state, rid, params, emit)
    if stream is not None:
        await stream.write(b"data: " + orjson.dumps(envelope) + b"\n\n")
        await stream.write_eof()
        return stream
    if raw is not None:
        return web.Response(status=status, body=raw, content_type="text/plain")
    return web.Response(body=orjson.dumps(envelope), content_type="application/json")


async def ws_handler(request: web.Request) -> web.WebSocketResponse:
    state = request.app[STATE_KEY]
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    tasks: set[asyncio.Task[None]] = set()

    async def serve(req: dict[str, Any]) -> None:
        method, rid, params = req.get("method"), req.get("id"), req.get("params") or {}
        state.record(str(method), params, dict(request.headers), "ws")
        if method == "session.cancel":
            await ws.send_bytes(orjson.dumps(await _handle_cancel(state, rid, params)))
            return
        if method == "acp.capabilities":
            await ws.send_bytes(orjson.dumps(_capabilities(rid)))
            return

        async def emit(message: dict[str, Any]) -> None:
            await ws.send_str(orjson.dumps(message).decode())

        envelope, raw, _ = await _turn(state, rid, params, emit)
        await ws.send_str(raw.decode() if raw is not None else orjson.dumps(envelope).decode())

    async for msg in ws:
        if msg.type != WSMsgType.TEXT:
            break
        try:
            req = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            continue
        task = asyncio.get_running_loop().create_task(serve(req))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    for task in tasks:
        task.cancel()
    return ws


async def get_state(request: web.Request) -> web.Response:
    return web.json_response(
        request.app[STATE_KEY].snapshot(), dumps=lambda o: orjson.dumps(o).decode()
    )


async def reset(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.requests.clear()
    state.cancels.clear()
    state.completed = state.cancelled_turns = 0
    return web.json_response({"ok": True})


def create_app(*, latency_ms: float = 0.0, chunks: int = 3) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = FakeState(latency_ms=latency_ms, chunks=chunks)
    app.router.add_post("/acp/rpc", rpc)
    app.router.add_post("/{prefix}/acp/rpc", rpc)
    app.router.add_get("/acp", ws_handler)
    app.router.add_get("/_state", get_state)
    app.router.add_post("/_reset", reset)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="fake upstream ACP provider (tests only)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (compose uses 0.0.0.0)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=3)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        app = create_app(latency_ms=args.latency_ms, chunks=args.chunks)
        asyncio.run(serve_forever(app, args.host, args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
