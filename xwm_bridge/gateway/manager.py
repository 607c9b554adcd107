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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.fanout import DROP_REASONS
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.gateway.runtime import ConnectConfig, GatewayRuntime, Notify
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.netaddr import HostPolicy
from xwm_bridge.proxy import ProxySettings
from xwm_bridge.tasks import Supervisor

log = logging.getLogger("xwm_bridge.gateway")

OPENCLAW = "openclaw"
LOCAL = "local"
#: why a connect that needed a new runtime was refused (``TOO_MANY``), for metrics
REFUSAL_REASONS = ("per_principal", "bridge")


def _obj(params: dict[str, Any], key: str) -> dict[str, Any]:
    value = params.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RpcError(INVALID_PARAMS, f"{key} must be an object")
    return value


@dataclass(frozen=True, slots=True)
class ConnectParams:
    runtime_id: str
    mode: str
    client: p.ClientInfo
    identity: p.Identity
    creds: p.Credentials
    host: str
    port: int
    tls: bool
    auth_mode: str
    auth_fields: tuple[str, ...]
    auth_sources: tuple[str, ...]
    has_shared_auth: bool
    has_device_token: bool

    @classmethod
    def parse(cls, params: dict[str, Any]) -> ConnectParams:
        endpoint = _obj(params, "endpoint")
        package = _obj(params, "packageInfo")
        device = _obj(params, "deviceInfo")
        identity = _obj(params, "identity")
        auth = _obj(params, "auth")
        return cls(
            runtime_id=coerce.text(params.get("runtimeId")),
            mode=coerce.text(params.get("gatewayProviderId"), LOCAL),
            client=p.ClientInfo(
                client_id=coerce.text(params.get("clientId"), p.DEFAULT_CLIENT_ID),
                app_name=coerce.text(package.get("appName")),
                version=coerce.text(package.get("version")),
                platform=coerce.text(device.get("platform")),
                platform_version=coerce.text(device.get("platformVersion")),
                device_family=coerce.text(device.get("deviceFamily")),
                model_identifier=coerce.text(device.get("modelIdentifier")),
                locale=coerce.text(params.get("locale")),
                user_agent=coerce.text(params.get("userAgent")),
            ),
            identity=p.Identity(
                device_id=coerce.text(identity.get("deviceId")),
                public_key=coerce.text(identity.get("publicKeyBase64Url")),
                private_key=coerce.text(identity.get("privateKeyBase64Url")),
            ),
            creds=p.Credentials(
                token=coerce.text(auth.get("token")),
                device_token=coerce.text(auth.get("deviceToken")),
                password=coerce.text(auth.get("password")),
            ),
            host=coerce.text(endpoint.get("host")),
            port=coerce.positive_int(endpoint.get("port")),
            tls=coerce.loose_bool(endpoint.get("tls")),
            auth_mode=coerce.text(params.get("connectAuthMode")),
            auth_fields=tuple(coerce.string_list(params.get("connectAuthFields")) or ()),
            auth_sources=tuple(coerce.string_list(params.get("connectAuthSources")) or ()),
            has_shared_auth=coerce.loose_bool(params.get("hasSharedAuth")),
            has_device_token=coerce.loose_bool(params.get("hasDeviceToken")),
        )


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _dial_url(host: str, port: int, tls: bool) -> str:
    """``ws(s)://host:port``, or INVALID_ENDPOINT before any dial: a port past 65535 or
    a host the URL would read differently (``/``, ``?``, ``@``, a stray ``]``)."""
    if port > 65535:
        raise GatewayError("endpoint.port must be between 1 and 65535", "INVALID_ENDPOINT")
    url = f"{'wss' if tls else 'ws'}://{_host_port(host, port)}"
    try:
        parts = urlsplit(url)
        same = parts.port == port and parts.hostname == host.strip("[]").lower()
        ok = same and not (parts.path or parts.query or parts.fragment or parts.username)
    except ValueError:
        ok = False
    if not ok:
        raise GatewayError(
            f"endpoint.host is not a host name or address: {host}", "INVALID_ENDPOINT"
        )
    return url


def openclaw_token(config: BridgeConfig) -> str:
    """The bare credential for the ``openclaw`` gateway (never ``Bearer …``: weakness 5)."""
    token = config.openclaw_token or config.internal_service_token or config.bridge_auth_token
    if token.lower().startswith("bearer "):
        token = token[7:].strip()
    return token


def build_connect_config(
    cp: ConnectParams, config: BridgeConfig, client_bearer: str
) -> ConnectConfig:
    """Resolve endpoint and credentials; ``openclaw`` mode takes both from bridge config."""
    if cp.mode.lower() == OPENCLAW:
        url = config.openclaw_url.strip()
        if not url:  # config validation lets only an empty one through
            raise GatewayError(
                "no OpenClaw gateway is configured (openclaw_url)", "INVALID_ENDPOINT"
            )
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        token = openclaw_token(config)
        return ConnectConfig(
            url=url,
            remote_address=_host_port(parts.hostname or "", port),
            mode=OPENCLAW,  # normalized: request-by-mode finds it whatever the client's case
            client=cp.client,
            identity=cp.identity,
            creds=p.Credentials(token=token, device_token=cp.creds.device_token),
            auth_mode="shared-token",
            auth_fields=("token",),
            auth_sources=("bridge",),
            has_shared_auth=bool(token),
            has_device_token=cp.has_device_token,
        )
    if not cp.host or not cp.port:
        raise GatewayError("endpoint.host and endpoint.port are required", "INVALID_ENDPOINT")
    url = _dial_url(cp.host, cp.port, cp.tls)
    policy = HostPolicy(config.gateway.allowed_hosts, config.configured_endpoints())
    if not policy.allows(cp.host, cp.port):
        raise GatewayError(f"gateway host not allowed: {cp.host}", "HOST_NOT_ALLOWED")
    creds = cp.creds
    if not creds.token and config.gateway.forward_client_bearer and client_bearer:
        creds = p.Credentials(client_bearer, creds.device_token, creds.password)
    address = _host_port(cp.host, cp.port)
    return ConnectConfig(
        url=url,
        remote_address=address,
        mode=cp.mode,
        client=cp.client,
        identity=cp.identity,
        creds=creds,
        auth_mode=cp.auth_mode,
        auth_fields=cp.auth_fields,
        auth_sources=cp.auth_sources,
        has_shared_auth=cp.has_shared_auth,
        has_device_token=cp.has_device_token,
    )


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
        #: connects refused for want of room, by reason
        self._refused: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        #: the bridge-wide limit refused a connect since the table last had room
        self._full = False
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
        return dict(self._refused)

    def _no_room(self, principal: str) -> GatewayError | None:
        """Why a new runtime of ``principal`` may not be made (called under the lock)."""
        limits = self._settings
        if len(self.runtimes_of(principal)) >= limits.max_runtimes_per_principal:
            self._refused["per_principal"] += 1
            return GatewayError("too many gateway runtimes for this client", "TOO_MANY")
        if len(self._runtimes) < limits.max_runtimes:
            self._full = False
            return None
        self._refused["bridge"] += 1
        if not self._full:  # once per full spell: a flood of bearers is not a flood of lines
            self._full = True
            log.warning(
                "gateway runtime refused: the bridge holds gateway.max_runtimes runtimes",
                extra={"limit": limits.max_runtimes, "principal": principal},
            )
        return GatewayError("too many gateway runtimes on this bridge", "TOO_MANY")

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
                refusal = self._no_room(principal)
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
