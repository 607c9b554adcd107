"""One OpenClaw gateway connection owned by one principal (gateway.md §1-§8, fixed).

A runtime runs the sans-I/O handshake over a ``websockets`` client socket,
then one owned task reads frames (tick liveness: silence for 2× the
gateway's ``tickIntervalMs`` counts as a dead socket) and, when the socket is
lost, reconnects with exponential backoff and jitter until a fatal error or a
manual disconnect. The old socket is always closed before a new one is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import dial
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig, offline_snapshot
from xwm_bridge.gateway.fanout import Fanout, Notify
from xwm_bridge.gateway.ignored import IgnoredFrames
from xwm_bridge.gateway.joins import Joins, Outcome
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.requests import Requests
from xwm_bridge.gateway.snapshot import Snapshot

__all__ = ["ConnectConfig", "GatewayRuntime", "Notify"]
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.tasks import Supervisor, stop, wait_for

log = logging.getLogger("xwm_bridge.gateway")

#: a turn's event tap: gets every event frame; cheap and non-blocking.
Tap = Callable[[p.EventFrame], None]

OFFLINE = GatewayError("gateway not connected", "OFFLINE")
SOCKET_RESET = GatewayError("socket reset", "SOCKET_RESET")
#: how long a stop waits for the runtime's loop task to end (then a warning)
LOOP_STOP_WITHIN = 5.0
#: the most of the gateway's announced ``tickIntervalMs`` liveness trusts: a huge one
#: would switch it off (pings are off, so a half-open socket would stay "connected")
MAX_TICK_MS = 300_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class GatewayRuntime:
    def __init__(
        self,
        runtime_id: str,
        owner: str,
        settings: GatewayConfig,
        tasks: Supervisor | None = None,
        proxies: ProxySettings | None = None,
        frame_counts: dict[str, int] | None = None,
        notify_drops: dict[str, int] | None = None,
    ) -> None:
        self.runtime_id = runtime_id
        #: the forward proxies of the bridge's environment (xwm_bridge/proxy.py)
        self._proxies = proxies
        #: owns the connection loop (the manager's supervisor)
        self._tasks = tasks or Supervisor()
        self.owner = owner
        self.settings = settings
        self.config: ConnectConfig | None = None
        self.snapshot = Snapshot()
        self.hello: p.Hello | None = None
        self.backoff = p.Backoff(settings.backoff_initial, settings.backoff_max)
        self.reconnects = 0
        self.last_activity = time.monotonic()
        self.active_calls = 0
        self._ws: ClientConnection | None = None
        #: done once the current socket is lost (made on first use: :attr:`socket_lost`)
        self._lost: asyncio.Future[None] | None = None
        self._loop_task: asyncio.Task[None] | None = None
        #: a client connect's dial + handshake, while it runs: a stop cancels it
        self._attempting: asyncio.Task[ClientConnection | GatewayError] | None = None
        #: bumped by every disconnect/close: a connect that started before one gives up
        self._stops = 0
        self._requests = Requests()
        #: connect and disconnect of one runtime never interleave (no leaked socket)
        self._op_lock = asyncio.Lock()
        #: the client connect running now, for connects with the same config to join
        self._joins = Joins()
        #: notifications only queue here: one writer per target (never the reader)
        self._fanout = Fanout(settings.notify_timeout, self._tasks, runtime_id, notify_drops)
        self._taps: set[Tap] = set()
        self._last_seq = 0
        self.ignored = IgnoredFrames(runtime_id, frame_counts)
        self.closed = False

    # --- notification fan-out ----------------------------------------------------------

    def attach(self, notify: Notify | None, connection: Any | None) -> None:
        self._fanout.attach(notify, connection)

    def detach(self, notify: Notify | None, connection: Any | None = None) -> None:
        self._fanout.detach(notify, connection)

    def has_live_owner(self) -> bool:
        return self._fanout.has_live_owner()

    async def settle(self, notify: Notify | None, connection: Any | None) -> None:
        """Until a call's notifications so far went out (at most ``notify_timeout``)."""
        await self._fanout.settle(notify, connection)

    def _publish(self, kind: str, key: str, value: Any) -> None:
        """Queue ``xworkmate.gateway.<kind>`` for every target (never waits on one)."""
        self._fanout.publish(
            f"xworkmate.gateway.{kind}", {"runtimeId": self.runtime_id, key: value}
        )

    def _log(self, level: str, category: str, message: str) -> None:
        getattr(log, "warning" if level == "warn" else level)(
            message, extra={"runtime_id": self.runtime_id, "category": category}
        )
        entry = {"timestampMs": now_ms(), "level": level, "category": category, "message": message}
        self._publish("log", "log", entry)

    def _emit_snapshot(self) -> None:
        self._publish("snapshot", "snapshot", self.snapshot.wire())

    def _push(self, event: str, payload: dict[str, Any], seq: int) -> None:
        self._publish("push", "event", {"event": event, "payload": payload, "sequence": seq})

    def add_tap(self, tap: Tap) -> None:
        self._taps.add(tap)

    def remove_tap(self, tap: Tap) -> None:
        self._taps.discard(tap)

    # --- lifecycle ---------------------------------------------------------------------

    def _offline_snapshot(self, cfg: ConnectConfig | None) -> Snapshot:
        return offline_snapshot(cfg, self.snapshot)

    async def connect(self, cfg: ConnectConfig) -> Outcome:
        """Client-initiated connect: close whatever ran before, try once, then own the loop.

        A connect with the same config as one still running (dialing, in its handshake)
        joins it and answers what it answers (a disconnect or close ending it ends both),
        instead of waiting behind it and then dialing again; a different config waits
        for the lock and replaces it (``joins.Joins``)."""
        return await self._joins.connect(cfg, self._op_lock, self._connect)

    async def _connect(self, cfg: ConnectConfig) -> Outcome:
        stops = self._stops
        await self._stop(SOCKET_RESET)
        self.closed = False
        self.config = cfg
        self.backoff.reset()
        self.snapshot = self._offline_snapshot(cfg)
        fields = ", ".join(cfg.auth_fields) or "none"
        sources = " · ".join(cfg.auth_sources) or "none"
        self._log(
            "info",
            "connect",
            f"attempt {cfg.remote_address} tls:{str(cfg.url.startswith('wss')).lower()} | "
            f"auth: {cfg.auth_mode} | fields: {fields} | sources: {sources}",
        )
        self.snapshot.status, self.snapshot.status_text = "connecting", "Connecting…"
        self.snapshot.remote_address = cfg.remote_address
        self._emit_snapshot()
        if self._stops != stops:  # a disconnect or close came in meanwhile: it wins
            self.snapshot = self._offline_snapshot(cfg)
            return None, SOCKET_RESET
        # its own task, so that a disconnect or close (which wait for this connect's
        # lock) can end a handshake still waiting out its deadlines
        attempt = self._tasks.spawn(
            self._attempt_or_error(cfg), name=f"gateway-connect:{self.runtime_id}"
        )
        self._attempting = attempt
        try:
            result = await attempt
        except asyncio.CancelledError:
            # the caller went away while the new socket was being announced, or a stop
            # ended the attempt: nothing reads the socket, it must not stay "connected"
            await self._drop_socket(SOCKET_RESET)
            self.snapshot = self._offline_snapshot(cfg)
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return None, SOCKET_RESET
        finally:
            self._attempting = None
        if isinstance(result, GatewayError):
            exc = result
            self._attempt_failed(cfg, exc)
            if not exc.fatal:
                self._loop_task = self._tasks.spawn(
                    self._run(None), name=f"gateway:{self.runtime_id}", service=True
                )
            return None, exc
        ws = result
        self._loop_task = self._tasks.spawn(
            self._run(ws), name=f"gateway:{self.runtime_id}", service=True
        )
        return self.hello, None

    def _stop_attempt(self) -> None:
        """End a client connect still dialing or in its handshake (it answers
        ``SOCKET_RESET``), instead of waiting out its deadlines behind its lock."""
        self._stops += 1
        if self._attempting is not None:
            self._attempting.cancel()

    async def disconnect(self) -> None:
        self._stop_attempt()
        async with self._op_lock:
            if self.config is None and self._ws is None:
                return
            self._log("info", "connect", "manual disconnect")
            await self._stop(SOCKET_RESET)
            self.snapshot = self._offline_snapshot(self.config)
            self._emit_snapshot()

    async def close(self) -> None:
        """Final close (idle reap or shutdown)."""
        self._stop_attempt()
        async with self._op_lock:
            await self._stop(SOCKET_RESET)
            self.closed = True
            await self._fanout.close()

    async def _stop(self, error: GatewayError) -> None:
        task, self._loop_task = self._loop_task, None
        try:
            if task is not None and task is not asyncio.current_task():
                # cancelled again until it ends: one cancel can be lost (tasks.stop), and
                # the runtime's lock is held meanwhile; a cancel of the caller propagates
                await stop(task, LOOP_STOP_WITHIN)
                if task.done() and not task.cancelled() and task.exception() is not None:
                    # the loop had died of a bug: the stop goes on
                    log.error(
                        "gateway runtime loop failed",
                        exc_info=task.exception(),
                        extra={"runtime_id": self.runtime_id},
                    )
        finally:
            await self._drop_socket(error)

    @property
    def socket_lost(self) -> asyncio.Future[None]:
        """Done once the current socket is lost — dropped, closed by the gateway, replaced
        by a connect, or the runtime disconnected or closed; already done without one.
        What a gateway turn waits on besides its run's events (never a poll)."""
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
            if self._ws is None:
                self._lost.set_result(None)
        return self._lost

    async def _drop_socket(self, error: GatewayError) -> None:
        ws, self._ws = self._ws, None
        lost, self._lost = self._lost, None
        if lost is not None and not lost.done():
            lost.set_result(None)
        self._requests.fail_all(error)
        if ws is not None:
            with contextlib.suppress(Exception):
                await wait_for(ws.close(), 2.0)

    async def _attempt_or_error(self, cfg: ConnectConfig) -> ClientConnection | GatewayError:
        """:meth:`_attempt` with its failure as a value: a supervised task that
        raised would be logged as a failed background task."""
        try:
            return await self._attempt(cfg)
        except GatewayError as exc:
            return exc

    async def _attempt(self, cfg: ConnectConfig) -> ClientConnection:
        """Dial + handshake; on success the socket is installed and the snapshot connected."""
        self.ignored.new_socket()  # its handshake's dropped frames count for it too
        ws, hello = await dial.connect(
            cfg.url,
            p.Handshake(
                cfg.client,
                cfg.identity,
                cfg.creds,
                request_id=self._requests.ids.next(),
                clock_ms=now_ms,
            ),
            self.settings,
            self.runtime_id,
            self._proxies,
            self.ignored.note,
        )
        self._accept(cfg, ws, hello)
        return ws

    def _accept(self, cfg: ConnectConfig, ws: ClientConnection, hello: p.Hello) -> None:
        self._lost = None  # the old socket's, set when it was dropped: this one gets its own
        self._ws = ws
        self.hello = hello
        self._last_seq = 0
        if hello.device_token:
            cfg = cfg.with_device_token(hello.device_token)
            self.config = cfg
        snap = self.snapshot
        snap.status, snap.status_text = "connected", "Connected"
        snap.remote_address = cfg.remote_address
        snap.auth_scopes = hello.scopes
        snap.auth_role = hello.role
        snap.server_name = hello.server_name
        snap.main_session_key = hello.main_session_key
        snap.last_connected_at_ms = now_ms()
        snap.has_device_token = cfg.has_device_token or bool(cfg.creds.device_token)
        snap.protocol = hello.protocol
        snap.last_error = snap.last_error_code = snap.last_error_detail_code = ""
        self._emit_snapshot()
        self._log(
            "info",
            "connect",
            f"connected {cfg.remote_address} | role: {hello.role} | scopes: {len(hello.scopes)}"
            f" | protocol: {hello.protocol}",
        )

    def _attempt_failed(self, cfg: ConnectConfig, exc: GatewayError) -> None:
        code, detail = exc.code or "unknown", exc.detail_code or "none"
        if exc.fatal:
            self._log(
                "warn", "socket", f"auto reconnect suppressed | code: {code} | detail: {detail}"
            )
        self._log(
            "error",
            "connect",
            f"failed {cfg.remote_address} | code: {code} | detail: {detail} | message: {exc}",
        )
        snap = self.snapshot
        snap.status, snap.status_text = "error", "Connection failed"
        snap.last_error, snap.last_error_code = exc.message, exc.code
        snap.last_error_detail_code = exc.detail_code
        self._emit_snapshot()

    async def _run(self, ws: ClientConnection | None) -> None:
        """Own the socket: read until lost, then reconnect with backoff unless fatal."""
        loop = asyncio.get_running_loop()
        while True:
            if ws is not None:
                opened = loop.time()
                await self._read(ws)
                if loop.time() - opened >= self.settings.backoff_max:
                    # only a socket that stayed up resets the backoff: a gateway that
                    # drops every socket right after hello-ok gets growing delays
                    self.backoff.reset()
                if self._ws is ws:
                    await self._drop_socket(GatewayError("socket closed", "SOCKET_CLOSED"))
                self._log("warn", "socket", "closed by gateway")
                snap = self.snapshot
                snap.status, snap.status_text = "error", "Disconnected"
                snap.last_error, snap.last_error_code = "Gateway connection closed", "SOCKET_CLOSED"
                self._emit_snapshot()
            cfg = self.config
            if cfg is None:
                return
            delay = self.backoff.next_delay()
            self._log(
                "warn",
                "socket",
                f"scheduling reconnect in {delay:.1f}s | code: "
                f"{self.snapshot.last_error_code or 'unknown'}",
            )
            await asyncio.sleep(delay)
            self._log("info", "socket", f"reconnect firing | host: {cfg.remote_address}")
            self.reconnects += 1
            try:
                ws = await self._attempt(cfg)
            except GatewayError as exc:
                self._attempt_failed(cfg, exc)
                if exc.fatal:
                    return
                ws = None

    async def _read(self, ws: ClientConnection) -> None:
        tick_ms = min(self.hello.tick_interval_ms if self.hello else 30_000, MAX_TICK_MS)
        silence = max(2 * tick_ms / 1000, 0.2)
        while True:
            try:
                data = await wait_for(ws.recv(), silence)
            except TimeoutError:
                self._log("warn", "socket", f"no frame for {silence:.1f}s; reconnecting")
                return
            except websockets.ConnectionClosed:
                return
            frame = p.decode_frame(data)
            if frame is None:
                self.ignored.note(p.ignored_reason(data), data)
            elif isinstance(frame, p.ResponseFrame):
                if not self._requests.deliver(frame):  # unknown, duplicate, or too late
                    self.ignored.note("unknown_response", data)
            elif isinstance(frame, p.EventFrame):
                if self._on_event(frame):
                    return
                await asyncio.sleep(0)  # the writers' turn: a burst must not fill outboxes

    def _on_event(self, ev: p.EventFrame) -> bool:
        """Handle one event; True when the gateway announced it is going away."""
        for tap in list(self._taps):
            tap(ev)
        if ev.seq > 0:
            if self._last_seq and ev.seq > self._last_seq + 1:
                self._log("warn", "sync", f"sequence gap detected | expected: {self._last_seq + 1}")
            self._last_seq = max(self._last_seq, ev.seq)
        if ev.event in ("connect.challenge", "tick"):
            return False
        if ev.event == "health":
            self.snapshot.health_payload = ev.payload
            self._emit_snapshot()
        elif ev.event in ("device.pair.requested", "device.pair.resolved"):
            req = ev.payload.get("requestId") or "unknown"
            dev = ev.payload.get("deviceId") or "unknown"
            self._log("info", "pairing", f"{ev.event} | request: {req} | device: {dev}")
        elif ev.event == "seqGap":
            self._log("warn", "sync", "sequence gap detected")
        elif ev.event in ("chat", "agent"):
            run = p.normalize_run(ev)
            if run is not None:
                self._push("chat.run", run, ev.seq)
        self._push(ev.event, ev.payload, ev.seq)
        return ev.event == "shutdown"

    # --- requests ----------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._ws is not None and self.snapshot.status == "connected"

    async def request(
        self, method: str, params: dict[str, Any] | None, deadline_s: float | None = None
    ) -> Any:
        """Send one request; return its payload or raise :class:`GatewayError` (§5.3)."""
        ws = self._ws
        if ws is None or not self.connected:
            self._log("warn", "rpc", f"blocked request {method} | offline")
            raise OFFLINE
        timeout = deadline_s if deadline_s and deadline_s > 0 else self.settings.request_timeout
        frame = await self._requests.call(ws, method, params, timeout)
        if frame.ok:
            return frame.payload
        error = p.error_from_frame(frame.error)
        self._log(
            "error",
            "rpc",
            f"request failed | code: {error.code or 'unknown'} | detail: "
            f"{error.detail_code or 'none'} | message: {error.message}",
        )
        raise error
