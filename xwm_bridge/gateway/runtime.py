"""One OpenClaw gateway connection owned by one principal (gateway.md §1-§8, fixed).

A runtime runs the sans-I/O handshake over a ``websockets`` client socket
(``attempts.py``), then one owned task reads frames (``reader.py``: tick liveness,
silence for 2× the gateway's ``tickIntervalMs`` counts as a dead socket) and, when
the socket is lost, reconnects with exponential backoff and jitter until a fatal
error or a manual disconnect. The old socket is always closed before a new one is
opened. The events it reads are handled in ``events.py``; what it tells clients goes
out through ``notices.py`` on its fan-out (``fanout.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from websockets.asyncio.client import ClientConnection

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import attempts, reader
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig, offline_snapshot
from xwm_bridge.gateway.events import Events, Tap
from xwm_bridge.gateway.fanout import Fanout, Notify
from xwm_bridge.gateway.ignored import IgnoredFrames
from xwm_bridge.gateway.joins import Joins, Outcome
from xwm_bridge.gateway.notices import Notices
from xwm_bridge.gateway.orphans import Orphans
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.requests import Requests
from xwm_bridge.gateway.snapshot import Snapshot
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.tasks import Supervisor, stop, wait_for

__all__ = ["ConnectConfig", "GatewayRuntime", "Notify", "Tap"]

log = logging.getLogger("xwm_bridge.gateway")

OFFLINE = GatewayError("gateway not connected", "OFFLINE")
SOCKET_RESET = GatewayError("socket reset", "SOCKET_RESET")
#: how long a stop waits for the runtime's loop task to end (then a warning)
LOOP_STOP_WITHIN = 5.0


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
        self._notices = Notices(self._fanout, runtime_id)
        #: event taps, sequence tracking, and what each event tells clients
        self._events = Events(runtime_id)
        self.ignored = IgnoredFrames(runtime_id, frame_counts)
        #: runs a lost socket left running: aborted once a socket is up again
        self._orphans = Orphans(runtime_id)
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

    def add_tap(self, tap: Tap) -> None:
        self._events.add_tap(tap)

    def remove_tap(self, tap: Tap) -> None:
        self._events.remove_tap(tap)

    # --- lifecycle ---------------------------------------------------------------------

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
        self.snapshot = offline_snapshot(cfg, self.snapshot)
        attempts.connecting(self.snapshot, cfg, self._notices)
        if self._stops != stops:  # a disconnect or close came in meanwhile: it wins
            self.snapshot = offline_snapshot(cfg, self.snapshot)
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
            self.snapshot = offline_snapshot(cfg, self.snapshot)
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return None, SOCKET_RESET
        finally:
            self._attempting = None
        if isinstance(result, GatewayError):
            exc = result
            attempts.failed(self.snapshot, cfg, exc, self._notices)
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
            self._notices.log("info", "connect", "manual disconnect")
            await self._stop(SOCKET_RESET)
            self.snapshot = offline_snapshot(self.config, self.snapshot)
            self._notices.snapshot(self.snapshot)

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
        ws, hello = await attempts.attempt(
            cfg,
            settings=self.settings,
            runtime_id=self.runtime_id,
            proxies=self._proxies,
            requests=self._requests,
            ignored=self.ignored,
        )
        self._lost = None  # the old socket's, set when it was dropped: this one gets its own
        self._ws = ws
        self.hello = hello
        self._events.new_socket()
        if hello.device_token:
            cfg = cfg.with_device_token(hello.device_token)
            self.config = cfg
        attempts.connected(self.snapshot, cfg, hello, self._notices)
        self._abort_orphans()
        return ws

    # --- runs a lost socket left ---------------------------------------------------------

    def abort_when_back(self, session_key: str, run_id: str) -> None:
        """``chat.abort`` the run once a socket is up (now, if one already is): its
        turn failed when its socket was lost, but the gateway runs it on."""
        if self.closed:
            return
        self._orphans.add(session_key, run_id)
        if self.connected:
            self._abort_orphans()

    def _abort_orphans(self) -> None:
        if len(self._orphans):
            runs = self._orphans.take()
            self._tasks.spawn(self._abort_runs(runs), name=f"gateway-orphans:{self.runtime_id}")

    async def _abort_runs(self, runs: list[tuple[str, str]]) -> None:
        """Each run's :meth:`abort_run`; one whose socket is lost again waits for the
        next one."""
        for session_key, run_id in runs:
            if not await self.abort_run(session_key, run_id) and not self.connected:
                self._orphans.add(session_key, run_id)

    async def abort_run(self, session_key: str, run_id: str) -> bool:
        """``chat.abort`` of one run, within ``abort_timeout``: whether the gateway says
        it aborted it (a failure is logged, and False)."""
        fields = {"runtime_id": self.runtime_id, "run_id": run_id}
        try:
            body = await self.request(
                "chat.abort",
                {"sessionKey": session_key, "runId": run_id},
                self.settings.abort_timeout,
            )
        except GatewayError as exc:
            log.warning("chat.abort failed", extra={**fields, "error": str(exc)})
            return False
        log.info("chat.abort answered", extra={**fields, "answer": body})
        return bool(isinstance(body, dict) and body.get("aborted"))

    async def _run(self, ws: ClientConnection | None) -> None:
        """Own the socket: read until lost, then reconnect with backoff unless fatal.

        However the loop ends other than by :meth:`_stop` (which drops the socket
        itself) — a fatal error, a bug, a cancel from elsewhere — the socket it owned is
        dropped: turns waiting on :attr:`socket_lost` and pending requests fail at once
        instead of at their own deadlines."""
        try:
            await self._reconnecting(ws)
        finally:
            if self._loop_task is asyncio.current_task() and self._ws is not None:
                await self._drop_socket(GatewayError("socket closed", "SOCKET_CLOSED"))
                reader.lost(self.snapshot, self._notices)

    async def _reconnecting(self, ws: ClientConnection | None) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if ws is not None:
                opened = loop.time()
                try:
                    await self._read(ws)
                except Exception:
                    # a bug in the read (per-frame ones are caught in reader.read): the
                    # socket counts as lost, its waiters fail now, the loop reconnects
                    log.error(
                        "gateway socket read failed",
                        exc_info=True,
                        extra={"runtime_id": self.runtime_id},
                    )
                if loop.time() - opened >= self.settings.backoff_max:
                    # only a socket that stayed up resets the backoff: a gateway that
                    # drops every socket right after hello-ok gets growing delays
                    self.backoff.reset()
                if self._ws is ws:
                    await self._drop_socket(GatewayError("socket closed", "SOCKET_CLOSED"))
                reader.lost(self.snapshot, self._notices)
            cfg = self.config
            if cfg is None:
                return
            delay = self.backoff.next_delay()
            self._notices.log(
                "warn",
                "socket",
                f"scheduling reconnect in {delay:.1f}s | code: "
                f"{self.snapshot.last_error_code or 'unknown'}",
            )
            await asyncio.sleep(delay)
            self._notices.log("info", "socket", f"reconnect firing | host: {cfg.remote_address}")
            self.reconnects += 1
            try:
                ws = await self._attempt(cfg)
            except GatewayError as exc:
                attempts.failed(self.snapshot, cfg, exc, self._notices)
                if exc.fatal:
                    return
                ws = None

    async def _read(self, ws: ClientConnection) -> None:
        await reader.read(
            ws,
            self.hello,
            requests=self._requests,
            ignored=self.ignored,
            on_event=lambda ev: self._events.handle(ev, self.snapshot, self._notices),
            notices=self._notices,
        )

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
            self._notices.log("warn", "rpc", f"blocked request {method} | offline")
            raise OFFLINE
        timeout = deadline_s if deadline_s and deadline_s > 0 else self.settings.request_timeout
        frame = await self._requests.call(ws, method, params, timeout)
        if frame.ok:
            return frame.payload
        error = p.error_from_frame(frame.error)
        self._notices.log(
            "error",
            "rpc",
            f"request failed | code: {error.code or 'unknown'} | detail: "
            f"{error.detail_code or 'none'} | message: {error.message}",
        )
        raise error
