"""``xworkmate.gateway.*`` methods and the per-principal runtime table (gateway.md §2, §9, §10).

Runtimes are keyed by (principal, runtimeId): a principal (the caller's bearer
credential) only ever sees its own runtimes, so another client can neither use
nor observe them. A principal holds at most ``gateway.max_runtimes_per_principal``
runtimes and the bridge at most ``gateway.max_runtimes`` of all principals together
(a bridge without a token takes any bearer: each new one is a new principal). A
runtime with no request in flight and no live owner WebSocket for
``gateway.idle_ttl`` is closed and forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_params import LOCAL, ConnectParams, build_connect_config
from xwm_bridge.gateway.fanout import DROP_REASONS
from xwm_bridge.gateway.limits import RuntimeLimits
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.runtime import GatewayRuntime, Notify
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.tasks import Supervisor

log = logging.getLogger("xwm_bridge.gateway")


def _failure(error: GatewayError, snapshot: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "ok": False,
        "snapshot": snapshot,
        "auth": None,
        "returnedDeviceToken": "",
        "error": error.to_wire(),
    }


class GatewayManager:
    def __init__(self, config: BridgeConfig, proxies: ProxySettings | None = None) -> None:
        self._config = config
        self._proxies = proxies
        self._settings = config.gateway
        self._runtimes: dict[tuple[str, str], GatewayRuntime] = {}
        #: frames every runtime dropped, by reason (reaped ones included)
        self._frame_counts: dict[str, int] = dict.fromkeys(p.IGNORED_REASONS, 0)
        #: notification targets every runtime dropped (a client that stopped reading)
        self._notify_drops: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        #: room for a new runtime, and the connects refused for want of it
        self._limits = RuntimeLimits(config.gateway)
        self._lock = asyncio.Lock()
        #: the runtimes' connection loops
        self._tasks = Supervisor()

    def status_counts(self) -> dict[str, int]:
        """Runtimes by snapshot status (connected, connecting, error, …), for metrics."""
        counts: dict[str, int] = {}
        for rt in self._runtimes.values():
            counts[rt.snapshot.status] = counts.get(rt.snapshot.status, 0) + 1
        return counts

    def frames_ignored(self) -> dict[str, int]:
        """Frames read from gateways and dropped, by reason, for metrics."""
        return dict(self._frame_counts)

    def notify_dropped(self) -> dict[str, int]:
        """Notification targets dropped (outbox overflow, write timeout), for metrics."""
        return dict(self._notify_drops)

    def connects_refused(self) -> dict[str, int]:
        """Connects refused with ``TOO_MANY``, by reason, for metrics."""
        return self._limits.refused()

    def status(self) -> list[dict[str, Any]]:
        """Every runtime (operator health view): state, last error, reconnects."""
        return [
            {
                "runtimeId": rt.runtime_id,
                "owner": owner,
                "mode": rt.snapshot.mode,
                "state": rt.snapshot.status,
                "lastError": rt.snapshot.last_error or None,
                "lastErrorCode": rt.snapshot.last_error_code or None,
                "reconnects": rt.reconnects,
                "activeCalls": rt.active_calls,
                "ignoredFrames": rt.ignored.total,
                "remoteAddress": rt.snapshot.remote_address or None,
                "lastConnectedAtMs": rt.snapshot.last_connected_at_ms or None,
            }
            for (owner, _), rt in self._runtimes.items()
        ]

    def runtimes_of(self, principal: str) -> list[GatewayRuntime]:
        return [rt for (owner, _), rt in self._runtimes.items() if owner == principal]

    def get(self, principal: str, runtime_id: str) -> GatewayRuntime | None:
        return self._runtimes.get((principal, runtime_id))

    def find(self, principal: str, mode: str, runtime_id: str = "") -> GatewayRuntime | None:
        """request-by-mode (§10.2), restricted to the caller's own runtimes."""
        if runtime_id:
            rt = self.get(principal, runtime_id)
            return rt if rt is not None and rt.connected else None
        wanted = (mode or LOCAL).strip().lower()
        for rt in self.runtimes_of(principal):
            if rt.connected and rt.snapshot.mode.strip().lower() == wanted:
                return rt
        return None

    @contextlib.contextmanager
    def using(self, rt: GatewayRuntime, notify: Notify | None, connection: Any | None) -> Any:
        """Mark a call in flight on ``rt``: its notifications also go to this call."""
        rt.attach(notify, connection)
        rt.active_calls += 1
        rt.last_activity = time.monotonic()
        try:
            yield rt
        finally:
            rt.active_calls -= 1
            rt.last_activity = time.monotonic()
            rt.detach(notify, connection)

    async def connect(
        self,
        params: dict[str, Any],
        principal: str,
        notify: Notify | None,
        connection: Any | None,
        client_bearer: str = "",
    ) -> dict[str, Any]:
        cp = ConnectParams.parse(params)
        if not cp.runtime_id:
            return _failure(GatewayError("runtimeId is required", "INVALID_RUNTIME_ID"), None)
        try:
            cfg = build_connect_config(cp, self._config, client_bearer)
        except GatewayError as exc:
            return _failure(exc, None)
        async with self._lock:
            rt = self.get(principal, cp.runtime_id)
            if rt is None:
                held = len(self.runtimes_of(principal))
                refusal = self._limits.refusal(principal, held, len(self._runtimes))
                if refusal is not None:
                    return _failure(refusal, None)
                rt = GatewayRuntime(
                    cp.runtime_id,
                    principal,
                    self._settings,
                    self._tasks,
                    self._proxies,
                    self._frame_counts,
                    self._notify_drops,
                )
                self._runtimes[(principal, cp.runtime_id)] = rt
        with self.using(rt, notify, connection):
            hello, error = await rt.connect(cfg)
            await rt.settle(notify, connection)  # its notifications before its answer
        if error is not None:
            return _failure(error, rt.snapshot.wire())
        assert hello is not None
        return {
            "ok": True,
            "snapshot": rt.snapshot.wire(),
            "auth": hello.auth,
            "returnedDeviceToken": hello.device_token,
            "error": None,
        }

    async def request(
        self, params: dict[str, Any], principal: str, notify: Notify | None, connection: Any | None
    ) -> dict[str, Any]:
        runtime_id = coerce.text(params.get("runtimeId"))
        method = coerce.text(params.get("method"))
        raw = params.get("params")
        gw_params = raw if isinstance(raw, dict) else {}
        timeout = self.request_deadline(params.get("timeoutMs"))
        rt = self.get(principal, runtime_id)
        if rt is None:
            return {
                "ok": False,
                "payload": None,
                "error": GatewayError("gateway not connected", "OFFLINE").to_wire(),
            }
        with self.using(rt, notify, connection):
            try:
                payload = await rt.request(method, gw_params, timeout)
            except GatewayError as exc:
                await rt.settle(notify, connection)
                return {"ok": False, "payload": None, "error": exc.to_wire()}
            await rt.settle(notify, connection)
        return {"ok": True, "payload": payload, "error": None}

    def request_deadline(self, timeout_ms: Any) -> float:
        """The deadline of a client's request, in seconds: its ``timeoutMs`` (a positive
        int; none: ``gateway.request_timeout``), at most ``gateway.turn_timeout`` (or the
        request timeout, if larger). The spec gives no bound; without one a client's
        request could hold its runtime (never reaped while a call is in flight) and
        its own connection for years. Clamped, not refused: the original took any value."""
        settings = self._settings
        ms = coerce.positive_int(timeout_ms)
        if ms <= 0:
            return settings.request_timeout
        return min(ms / 1000, max(settings.turn_timeout, settings.request_timeout))

    async def disconnect(
        self, params: dict[str, Any], principal: str, notify: Notify | None, connection: Any | None
    ) -> dict[str, Any]:
        rt = self.get(principal, coerce.text(params.get("runtimeId")))
        if rt is not None:
            with self.using(rt, notify, connection):
                await rt.disconnect()
                await rt.settle(notify, connection)
        return {"accepted": True}

    async def reap(self, now: float | None = None) -> int:
        """Close runtimes idle for ``idle_ttl`` (no call in flight, no live owner socket)."""
        now = time.monotonic() if now is None else now
        ttl = self._settings.idle_ttl

        def idle(rt: GatewayRuntime) -> bool:
            return (
                rt.active_calls == 0 and not rt.has_live_owner() and now - rt.last_activity >= ttl
            )

        closed = 0
        for key in [key for key, rt in self._runtimes.items() if idle(rt)]:
            # asked again: a call may have taken it while an earlier one was closing
            rt = self._runtimes.get(key)
            if rt is None or not idle(rt):
                continue
            del self._runtimes[key]
            log.info("closing idle gateway runtime", extra={"runtime_id": rt.runtime_id})
            await rt.close()
            closed += 1
        return closed

    async def run_reaper(self) -> None:
        interval = max(0.05, min(self._settings.idle_ttl / 2, 30.0))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except Exception:  # one runtime's failed close must not end the reaping
                log.exception("gateway reaper: closing idle runtimes failed; it goes on")

    async def close(self) -> None:
        runtimes, self._runtimes = list(self._runtimes.values()), {}
        await asyncio.gather(*(rt.close() for rt in runtimes), return_exceptions=True)
        await self._tasks.shutdown(0)  # any loop a close left behind
