"""``/livez``, ``/readyz`` and ``/metrics``: unauthenticated, minimal, cheap.

``/readyz`` asks the session store (:meth:`SessionStore.health`: SQLite takes a
probe write, Redis answers PING) and, when configured, the providers; a 503
names the check that failed.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from xwm_bridge.endpoint import EndpointError, derive_endpoint
from xwm_bridge.observability.metrics import CONTENT_TYPE
from xwm_bridge.tasks import wait_for

if TYPE_CHECKING:
    from xwm_bridge.app.bridge import Bridge

PROBE_TIMEOUT = 2.0
PROBE_CACHE_SECONDS = 5.0
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def _json(status: int, body: dict[str, object]) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body) + b"\n", content_type="application/json"
    )


async def _reachable(url: str) -> str | None:
    """None when a TCP connection opens within the deadline, else the reason."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
    try:
        _, writer = await wait_for(asyncio.open_connection(host, port), PROBE_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        return f"cannot connect to {host}:{port}: {exc.__class__.__name__}"
    writer.close()
    return None


class HealthHandlers:
    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._cached: tuple[float, dict[str, str]] | None = None

    async def livez(self, request: web.Request) -> web.Response:
        return _json(200, {"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self._bridge.supervisor.closing:
            return _json(503, {"status": "unready", "reason": "shutting down"})
        store = await self._bridge.store.health()
        if not store.ok:
            return _json(
                503,
                {
                    "status": "unready",
                    "reason": f"session store not {store.check}",
                    "store": store.wire(),
                },
            )
        if not self._bridge.config.ready_requires_providers:
            return _json(200, {"status": "ready"})
        failures = await self._probe()
        if failures:
            return _json(
                503, {"status": "unready", "reason": "providers unreachable", "providers": failures}
            )
        return _json(200, {"status": "ready"})

    async def _probe(self) -> dict[str, str]:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < PROBE_CACHE_SECONDS:
            return self._cached[1]
        providers = self._bridge.config.available_providers
        reasons: list[str | None] = []
        for p in providers:
            try:
                reasons.append(await _reachable(derive_endpoint(p.endpoint).url))
            except EndpointError as exc:
                reasons.append(str(exc))
        failures = {p.id: r for p, r in zip(providers, reasons, strict=True) if r is not None}
        if not providers:
            failures = {"*": "no provider is enabled"}
        self._cached = (now, failures)
        return failures

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._bridge.metrics.render(), headers={"Content-Type": CONTENT_TYPE}
        )
