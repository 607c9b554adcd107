"""Gateway-mode turns (forwarding.md §7, fixed): ``chat.send`` on the caller's own runtime.

The turn streams the run's ``chat``/``agent`` events (demultiplexed by
``sessionKey`` and ``runId``, since OpenClaw broadcasts every run to every
operator connection) as ``session.update`` notifications, and ends on the
run's terminal event. ``session.cancel`` and the turn deadline both send
``chat.abort``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.executors import CANCELLED
from xwm_bridge.core.handles import cancel_arrived
from xwm_bridge.core.modes import Mode
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_params import LOCAL
from xwm_bridge.gateway.manager import GatewayManager
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.runtime import GatewayRuntime

MODE = Mode.GATEWAY_CHAT.value

NOT_CONNECTED = "gateway not connected"
CONNECTION_LOST = "gateway connection lost during the run"
TERMINAL = ("final", "aborted", "error")


@dataclass(slots=True, eq=False)
class RunTap:
    """Collects the events of one run off a runtime's broadcast stream."""

    session_key: str
    run_id: str = ""
    #: the run's events; ``None`` (last) when the socket the run is on was lost
    queue: asyncio.Queue[p.EventFrame | None] = field(default_factory=lambda: asyncio.Queue(4096))
    early: list[p.EventFrame] = field(default_factory=list)

    def lost(self, _signal: object = None) -> None:
        """The run's socket is gone (a done-callback of ``GatewayRuntime.socket_lost``):
        wake the turn at once, behind the events already queued."""
        if self.queue.full():
            self.queue.get_nowait()
        self.queue.put_nowait(None)

    def __call__(self, ev: p.EventFrame) -> None:
        if ev.event not in ("chat", "agent"):
            return
        key, run_id = p.event_keys(ev)
        if self.run_id:
            if run_id != self.run_id:
                return
        elif not _same_session(key, self.session_key):
            return
        if self.queue.full():  # bounded: a runaway stream drops deltas, never blocks the reader
            if ev.event != "chat" or coerce.text(ev.payload.get("state")) not in TERMINAL:
                return
            self.queue.get_nowait()  # the run's end always gets in: the oldest event goes
        self.queue.put_nowait(ev)


def _same_session(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    return a == b or a.endswith(":" + b) or b.endswith(":" + a)


def session_key_for(ctx: TurnContext, rt: GatewayRuntime) -> str:
    explicit = coerce.text(ctx.params.get("gatewaySessionKey")) or coerce.text(
        ctx.params.get("sessionKey")
    )
    if explicit:
        return explicit
    agent = "main"
    main = rt.snapshot.main_session_key
    if main.startswith("agent:") and main.count(":") >= 2:
        agent = main.split(":")[1]
    return f"agent:{agent}:xwm-{ctx.session_id}"


class GatewayTurnExecutor:
    MODE = MODE

    def __init__(self, manager: GatewayManager) -> None:
        self._manager = manager
        self._aborted: dict[str, bool] = {}

    def _failure(self, ctx: TurnContext, message: str, **extra: Any) -> dict[str, Any]:
        return {"success": False, "error": message, "turnId": ctx.turn_id, "mode": MODE, **extra}

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        mode = coerce.text(ctx.params.get("gatewayProvider"), LOCAL)
        runtime_id = coerce.text(ctx.params.get("gatewayRuntimeId"))
        rt = self._manager.find(ctx.principal, mode, runtime_id)
        if rt is None:
            await ctx.emit_error(NOT_CONNECTED)
            return self._failure(ctx, NOT_CONNECTED)
        # a turn on a long-lived connection (WebSocket, stdio) gets the run's pushes over
        # it only: its notify wraps the connection's, so both would send each one twice
        with self._manager.using(rt, ctx.notify, ctx.connection):
            result = await self._run(ctx, rt)
            # the run's raw pushes queued for this call go out first
            await rt.settle(ctx.notify, ctx.connection)
            return result

    async def _run(self, ctx: TurnContext, rt: GatewayRuntime) -> dict[str, Any]:
        settings = rt.settings
        session_key = session_key_for(ctx, rt)
        idempotency_key = f"xwm-{ctx.turn_id}"
        tap = RunTap(session_key)
        rt.add_tap(tap)
        # the socket chat.send goes out on: OpenClaw only sends a run's events to live
        # sockets, so once it is lost (a reconnect is another socket) the run is gone
        lost = rt.socket_lost
        lost.add_done_callback(tap.lost)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.turn_timeout
        run_id = ""
        try:
            try:
                payload = await rt.request(
                    "chat.send",
                    {
                        "sessionKey": session_key,
                        # this turn's own prompt: not the session's latest, which another
                        # thread's turn of the session may have added meanwhile
                        "message": ctx.turn.prompt,
                        "idempotencyKey": idempotency_key,
                    },
                    min(settings.request_timeout, settings.turn_timeout),
                )
            except GatewayError as exc:
                extra: dict[str, Any] = {}
                if exc.code == "RPC_TIMEOUT":
                    # written but not answered: the run may have started, and nobody
                    # would end it (one whose model is down retries for ever)
                    extra["aborted"] = await self._abort(ctx, rt, session_key, idempotency_key)
                elif exc.code == "SOCKET_CLOSED":  # lost after it was written: the same,
                    rt.abort_when_back(session_key, idempotency_key)  # once back
                await ctx.emit_error(exc.message)
                return self._failure(ctx, exc.message, **extra)
            body = payload if isinstance(payload, dict) else {}
            run_id = coerce.text(body.get("runId"), idempotency_key)
            tap.run_id = run_id
            # events that raced ahead of the response, but of another run, are dropped
            return await self._stream(ctx, rt, tap, session_key, run_id, deadline)
        except asyncio.CancelledError:
            cancel_arrived()  # not sent again into the chat.abort
            self._aborted[ctx.turn_id] = await self._abort(
                ctx, rt, session_key, run_id or idempotency_key
            )
            raise
        finally:
            lost.remove_done_callback(tap.lost)
            rt.remove_tap(tap)

    async def _stream(
        self,
        ctx: TurnContext,
        rt: GatewayRuntime,
        tap: RunTap,
        session_key: str,
        run_id: str,
        deadline: float,
    ) -> dict[str, Any]:
        """The run until its end, within the turn's deadline: a ``session.update`` to a
        slow client still going out then is cut there (as a cancel cuts it), and the run
        is aborted. The closing notice (one delivery) comes after the deadline."""
        deltas: list[str] = []
        within = asyncio.timeout_at(deadline)
        try:
            async with within:
                end = await self._events(ctx, tap, run_id, deltas)
        except TimeoutError:
            if not within.expired():
                raise
            aborted = await self._abort(ctx, rt, session_key, run_id)
            message = f"gateway turn timed out after {rt.settings.turn_timeout:g}s"
            await ctx.emit_error(message)
            return self._failure(
                ctx,
                message,
                timedOut=True,
                aborted=aborted,
                runId=run_id,
                sessionKey=session_key,
            )
        if end is None:  # the socket was lost (RunTap.lost): the run's events with it
            rt.abort_when_back(session_key, run_id)  # the gateway runs it on
            await ctx.emit_error(CONNECTION_LOST)
            return self._failure(ctx, CONNECTION_LOST, runId=run_id, sessionKey=session_key)
        payload = end.payload
        state = coerce.text(payload.get("state"))
        final_text = p.extract_text(payload.get("message")) or "".join(deltas)
        return await self._finish(ctx, state, final_text, run_id, session_key, payload)

    async def _events(
        self, ctx: TurnContext, tap: RunTap, run_id: str, deltas: list[str]
    ) -> p.EventFrame | None:
        """Pass on the run's tool calls and deltas; its terminal event, or ``None`` once
        the socket the run is on was lost."""
        while True:
            ev = await tap.queue.get()
            if ev is None:
                return None
            _key, ev_run = p.event_keys(ev)
            if ev_run and ev_run != run_id:
                continue
            payload = ev.payload
            if ev.event == "agent":
                stream = coerce.text(payload.get("stream")).lower()
                data = payload.get("data") if isinstance(payload.get("data"), dict) else {}
                if stream == "tool":
                    await ctx.emit(
                        {
                            "type": "tool",
                            "runId": run_id,
                            "tool": data,
                            "pending": True,
                            "error": False,
                        }
                    )
                continue
            state = coerce.text(payload.get("state"))
            if state == "delta":
                text = _delta_text(payload)
                if text:
                    deltas.append(text)
                    await ctx.emit({"type": "delta", "delta": text, "runId": run_id})
            elif state in TERMINAL:
                return ev

    async def _finish(
        self,
        ctx: TurnContext,
        state: str,
        text: str,
        run_id: str,
        session_key: str,
        payload: dict[str, Any],
    ) -> dict[str, Any]:
        base = {"runId": run_id, "sessionKey": session_key, "state": state}
        if state == "final":
            await ctx.emit(
                {
                    "type": "final",
                    "runId": run_id,
                    "message": text,
                    "stopReason": coerce.text(payload.get("stopReason")),
                    "pending": False,
                    "error": False,
                }
            )
            return {
                "success": True,
                "output": text,
                "summary": text,
                "stopReason": coerce.text(payload.get("stopReason")),
                "turnId": ctx.turn_id,
                "mode": MODE,
                **base,
            }
        if state == "aborted":
            await ctx.emit_error("gateway run aborted")
            return self._failure(ctx, "gateway run aborted", aborted=True, output=text, **base)
        message = coerce.text(payload.get("errorMessage"), "gateway run failed")
        await ctx.emit_error(message)
        return self._failure(ctx, message, **base)

    async def _abort(
        self, ctx: TurnContext, rt: GatewayRuntime, session_key: str, run_id: str
    ) -> bool:
        """``chat.abort`` within ``abort_timeout``, even while this task is being cancelled."""
        # owned by the bridge's supervisor: it outlives this task's cancellation, bounded
        abort = rt.abort_run(session_key, run_id)
        task = ctx.supervisor.spawn(abort, name=f"gateway-abort:{run_id}")
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # cancelled again while aborting: let the bounded abort finish, then go
            await asyncio.wait({task}, timeout=rt.settings.abort_timeout)
            raise

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        aborted = self._aborted.pop(ctx.turn_id, False)
        await ctx.emit_error(CANCELLED)
        return self._failure(ctx, CANCELLED, cancelled=True, aborted=aborted)


def _delta_text(payload: dict[str, Any]) -> str:
    for key in ("deltaText", "delta", "text"):
        value = payload.get(key)
        if isinstance(value, str) and value:
            return value
    return ""
