"""Pairing endpoints ``/bridge/bootstrap/health`` and ``/consume`` (adapters.md §5).

Unauthenticated by design (the app has no token yet), so: rate-limited per
client address, and the client's ``bridge`` must name this bridge's public URL
(the original relayed any value to the accounts service).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from xwm_bridge.httpbody import BodyTooLarge, read_capped
from xwm_bridge.observability.rejections import (
    BAD_BODY,
    FOREIGN_BRIDGE,
    METHOD_NOT_ALLOWED,
    RATE_LIMITED,
    reject,
)

if TYPE_CHECKING:
    from xwm_bridge.app.bridge import Bridge

log = logging.getLogger("xwm_bridge.bootstrap")

ISSUED_BY = "xworkmate-bridge"
CONSUME_PATH = "/api/internal/xworkmate/bridge/bootstrap/consume"
MAX_TRACKED_CLIENTS = 10_000
#: the accounts service's answer is read to its end, up to this
MAX_ACCOUNTS_REPLY = 1024 * 1024


def _text(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=message + "\n", content_type="text/plain", headers=headers
    )


class RateLimiter:
    """Sliding one-minute window per key, with a bounded number of keys."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._hits: OrderedDict[str, deque[float]] = OrderedDict()

    def allow(self, key: str, now: float | None = None) -> bool:
        if self.per_minute <= 0:
            return True
        now = time.monotonic() if now is None else now
        hits = self._hits.pop(key, None) or deque()
        while hits and now - hits[0] >= 60.0:
            hits.popleft()
        allowed = len(hits) < self.per_minute
        if allowed:
            hits.append(now)
        self._hits[key] = hits
        while len(self._hits) > MAX_TRACKED_CLIENTS:
            self._hits.popitem(last=False)
        return allowed


class BootstrapHandlers:
    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self._limiter = RateLimiter(bridge.config.limits.bootstrap_requests_per_minute)

    @property
    def public_base_url(self) -> str:
        return self._bridge.config.public_base_url.rstrip("/")

    async def health(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return _text(405, "method not allowed")
        body = {"ok": True, "bridgeOrigin": self.public_base_url, "issuedBy": ISSUED_BY}
        return web.Response(body=orjson.dumps(body) + b"\n", content_type="application/json")

    def _failed(self, reason: str, status: int, answer: str, cause: str = "") -> web.Response:
        """A consume that failed on the bridge's side (not the client's): a warning (why:
        ``cause``, else ``answer``; never the ticket or the service token) and
        ``xwm_bootstrap_failures_total{reason}`` (``transport``, ``timeout``,
        ``http_status``, ``protocol``, ``not_configured``); the client gets ``status``
        with ``answer`` as its text. A 4xx of the accounts service (a ticket unknown,
        used or expired: the client's) is logged at info."""
        self._bridge.metrics.bootstrap_failed.get(reason).inc()
        level = logging.INFO if 400 <= status < 500 and reason == "http_status" else logging.WARNING
        log.log(
            level,
            "bootstrap consume failed",
            extra={"reason": reason, "status": status, "error": (cause or answer)[:500]},
        )
        return _text(status, answer)

    def _reject(self, request: web.Request, reason: str, status: int) -> None:
        reject(
            self._bridge.metrics,
            "bootstrap",
            reason,
            status=status,
            path=request.path,
            remote=request.remote or "",
        )

    async def consume(self, request: web.Request) -> web.Response:
        if request.method != "POST":
            self._reject(request, METHOD_NOT_ALLOWED, 405)
            return _text(405, "method not allowed")
        if not self._limiter.allow(request.remote or "unknown"):
            self._reject(request, RATE_LIMITED, 429)
            return _text(
                429, "too many bootstrap requests; retry in a minute", {"Retry-After": "60"}
            )
        cfg = self._bridge.config
        try:
            async with asyncio.timeout(cfg.limits.request_read_timeout):  # a slow body ends
                raw = await request.read()
            body = orjson.loads(raw)
        except (web.HTTPRequestEntityTooLarge, orjson.JSONDecodeError):
            self._reject(request, BAD_BODY, 400)
            return _text(400, "invalid request body")
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            self._reject(request, BAD_BODY, 400)
            return _text(400, "invalid request body")
        if not isinstance(body, dict) or any(
            k in body and not isinstance(body[k], str) for k in ("ticket", "bridge")
        ):
            self._reject(request, BAD_BODY, 400)
            return _text(400, "invalid request body")
        ticket = str(body.get("ticket", "")).strip()
        if not ticket:
            return _text(400, "ticket is required")
        bridge = str(body.get("bridge", "")).strip().rstrip("/") or self.public_base_url
        if bridge != self.public_base_url:
            # 403 as the accounts service answers a ticket for another bridge (the
            # original relayed the request and passed that status through)
            self._reject(request, FOREIGN_BRIDGE, 403)
            return _text(403, "bridge does not match this bridge's public URL")
        token = cfg.internal_service_token
        if not token:
            return self._failed("not_configured", 500, "internal service token is not configured")
        url = cfg.accounts_base_url.rstrip("/") + CONSUME_PATH
        try:
            async with self._bridge.http.post(
                url,
                data=orjson.dumps({"ticket": ticket, "bridge": bridge}),
                headers={"Content-Type": "application/json", "X-Service-Token": token},
                timeout=aiohttp.ClientTimeout(total=cfg.limits.bootstrap_timeout),
                allow_redirects=False,  # the service token goes to ACCOUNTS_BASE_URL only
            ) as resp:
                status = resp.status
                payload = await read_capped(resp, MAX_ACCOUNTS_REPLY)
        except (aiohttp.ClientError, TimeoutError) as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else "transport"
            # str, not repr: a connection error's repr holds its key, proxy credentials too
            why = f"{type(exc).__name__}: {exc}"
            return self._failed(kind, 502, "failed to contact accounts service", why)
        except BodyTooLarge:
            return self._failed("protocol", 502, "accounts bootstrap response too large")
        if not 200 <= status < 300:
            return self._failed("http_status", status, "accounts bootstrap consume failed")
        try:
            accounts = orjson.loads(payload)
            if not isinstance(accounts, dict):
                raise ValueError
        except (orjson.JSONDecodeError, ValueError):
            return self._failed("protocol", 502, "failed to decode accounts bootstrap response")
        return web.Response(
            body=orjson.dumps(self._answer(accounts, bridge)) + b"\n",
            content_type="application/json",
        )

    @staticmethod
    def _answer(accounts: dict[str, Any], bridge: str) -> dict[str, Any]:
        def s(key: str) -> str:
            value = accounts.get(key)
            return value if isinstance(value, str) else ""

        token, url = s("BRIDGE_AUTH_TOKEN"), s("BRIDGE_SERVER_URL")
        scopes = accounts.get("scopes")
        scopes = [x for x in scopes if isinstance(x, str)] if isinstance(scopes, list) else None
        setup = {
            "BRIDGE_AUTH_TOKEN": token,
            "BRIDGE_SERVER_URL": url,
            "authMode": s("authMode"),
            "bridgeOrigin": bridge,
            "expiresAt": s("expiresAt"),
            "issuedBy": ISSUED_BY,
            "token": token,
            "url": url,
        }
        return {
            "setupCode": orjson.dumps(setup).decode(),
            "bridgeOrigin": bridge,
            "authMode": s("authMode"),
            "expiresAt": s("expiresAt"),
            "issuedBy": ISSUED_BY,
            "scopes": scopes,
        }
