"""Calls to upstream ACP providers over HTTP (JSON or SSE) and WebSocket (forwarding.md §4.4-4.5).

The I/O half of :mod:`.upstream_call`: it moves bytes and acts on the events the
call object sorts them into. Better than the original: every call has connect,
read and total deadlines; an HTTP upstream that answers with SSE is streamed
through; a plain-JSON answer is read to its end (or to the size cap); the
connection pool is shared and kept alive; cancellation closes the upstream
request and :meth:`UpstreamClient.send_cancel` tells the provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import websockets
from websockets.asyncio.client import connect as ws_connect

from xwm_bridge.config import ProviderConfig
from xwm_bridge.endpoint import Endpoint
from xwm_bridge.providers.http1 import Http1Error, Response, Target
from xwm_bridge.providers.http1_pool import Http1Pool
from xwm_bridge.providers.upstream_call import (
    Event,
    Notification,
    UpstreamCall,
    UpstreamProtocolError,
)
from xwm_bridge.proxy import ProxySettings, ws_error
from xwm_bridge.tasks import Deadlines, wait_for

__all__ = ["MAX_UPSTREAM_RESPONSE", "UpstreamClient", "UpstreamError"]

#: called with the notifications that arrived together (one read, one WebSocket message)
OnNotifications = Callable[[list[dict[str, Any]]], Awaitable[None]]
MAX_UPSTREAM_RESPONSE = 64 * 1024 * 1024
_JSON = "application/json"
_JSON_OR_SSE = "application/json, text/event-stream"


class UpstreamError(Exception):
    """A failed upstream call; ``str()`` is the error text put in the result."""

    def __init__(self, message: str, *, timed_out: bool = False, kind: str = "") -> None:
        super().__init__(message)
        self.timed_out = timed_out
        #: metrics label: timeout, transport, http_status, protocol or remote_error
        self.kind = kind or ("timeout" if timed_out else "protocol")


class UpstreamClient:
    def __init__(self, pool: Http1Pool, proxies: ProxySettings | None = None) -> None:
        self._pool = pool
        #: the forward proxies (xwm_bridge/proxy.py); each URL's is decided once, with
        #: its cached head below, so a call without a proxy costs nothing more
        self._proxies = proxies or ProxySettings()
        #: (url, stream, authorization) → parsed target and pre-built request head
        self._heads: dict[tuple[str, bool, str], tuple[Target, bytes]] = {}
        #: every call's ``total_timeout``, on one loop timer (not one per call)
        self._deadlines = Deadlines()

    def _head(self, url: str, stream: bool, authorization: str) -> tuple[Target, bytes]:
        key = (url, stream, authorization)
        hit = self._heads.get(key)
        if hit is None:
            headers = {
                "Content-Type": "application/json; charset=utf-8",
                "Accept": _JSON_OR_SSE if stream else _JSON,
            }
            if authorization:
                headers["Authorization"] = authorization
            target = Target.parse(url, self._proxies)
            if len(self._heads) >= 256:  # bounded: urls and credentials come from config
                self._heads.clear()
            hit = self._heads[key] = (target, target.head(headers))
        return hit

    async def call(
        self,
        provider: ProviderConfig,
        endpoint: Endpoint,
        authorization: str,
        method: str,
        params: Mapping[str, Any],
        on_notifications: OnNotifications,
        *,
        stream: bool = True,
    ) -> dict[str, Any]:
        """Send one request; return the upstream response envelope or raise UpstreamError.

        ``stream`` asks an HTTP upstream for SSE (``Accept: text/event-stream``).
        """
        call = UpstreamCall(method, params)
        try:
            with self._deadlines.within(provider.total_timeout):
                if endpoint.transport == "ws":
                    return await self._call_ws(
                        provider, endpoint.ws_url, authorization, call, on_notifications
                    )
                return await self._call_http(
                    provider, endpoint.http_url, authorization, call, on_notifications, stream
                )
        except TimeoutError:
            raise UpstreamError(
                f"upstream {provider.id} timed out (no answer within "
                f"{provider.total_timeout:g}s, providers[].total_timeout)",
                timed_out=True,
            ) from None
        except UpstreamProtocolError as exc:
            raise UpstreamError(str(exc), kind=exc.kind) from None

    async def _call_http(
        self,
        provider: ProviderConfig,
        url: str,
        authorization: str,
        call: UpstreamCall,
        on_notifications: OnNotifications,
        stream: bool,
    ) -> dict[str, Any]:
        try:
            target, head = self._head(url, stream, authorization)
        except ValueError as exc:
            raise UpstreamError(f"POST {url}: {exc}", kind="transport") from None
        try:
            resp = await self._pool.post(
                target,
                head,
                call.request,
                connect_timeout=provider.connect_timeout,
                read_timeout=provider.read_timeout,
            )
            try:
                if resp.content_type == "text/event-stream":
                    envelope = await self._read_sse(resp, call, on_notifications)
                else:
                    body = await resp.read(MAX_UPSTREAM_RESPONSE)
                    envelope = call.body(body, resp.status).envelope
            except BaseException:
                resp.close()  # no-op once the answer was read whole
                raise
            # an SSE answer may end a moment after its response event: pooled then
            resp.release()
            return envelope
        except Http1Error as exc:
            if exc.kind == "protocol" and "too large" in str(exc):
                raise UpstreamError("upstream response too large") from None
            timed_out = exc.kind == "timeout"
            raise UpstreamError(
                f"POST {url}: {exc}",
                timed_out=timed_out,
                kind="" if timed_out else "transport",
            ) from None

    @staticmethod
    async def _read_sse(
        resp: Response, call: UpstreamCall, on_notifications: OnNotifications
    ) -> dict[str, Any]:
        while chunk := await resp.chunk():
            await _deliver(call.sse(chunk, max_line=MAX_UPSTREAM_RESPONSE), on_notifications)
            if call.response is not None:
                return call.response
        # end of stream: a last event without its blank line still counts; no response raises
        await _deliver(call.sse(b"", max_line=MAX_UPSTREAM_RESPONSE), on_notifications)
        assert call.response is not None
        return call.response

    async def _call_ws(
        self,
        provider: ProviderConfig,
        url: str,
        authorization: str,
        call: UpstreamCall,
        on_notifications: OnNotifications,
    ) -> dict[str, Any]:
        headers = {"Authorization": authorization} if authorization else None
        route = self._proxies.for_url(url)
        try:
            async with ws_connect(
                url,
                additional_headers=headers,
                # the whole open (proxy connect and CONNECT answer included)
                open_timeout=provider.connect_timeout,
                max_size=MAX_UPSTREAM_RESPONSE,
                compression=None,
                # explicit: never websockets' own reading of the environment
                proxy=route.url if route is not None else None,
            ) as ws:
                await ws.send(call.request, text=True)  # JSON goes out as a text frame
                while True:
                    try:
                        raw = await wait_for(ws.recv(), provider.read_timeout)
                    except TimeoutError:
                        raise UpstreamError(
                            f"{url}: no message from upstream for {provider.read_timeout:g}s",
                            timed_out=True,
                        ) from None
                    await _deliver(call.message(raw), on_notifications)
                    if call.response is not None:
                        return call.response
        except websockets.exceptions.WebSocketException as exc:
            raise UpstreamError(f"{url}: {ws_error(exc, route)}", kind="transport") from None
        except OSError as exc:
            raise UpstreamError(f"{url}: {ws_error(exc, route)}", kind="transport") from None

    async def send_cancel(
        self,
        provider: ProviderConfig,
        endpoint: Endpoint,
        authorization: str,
        params: dict[str, Any],
        deadline: float,
    ) -> None:
        """Tell the provider to cancel ``params['sessionId']``; best effort, bounded."""

        async def noop(_: list[dict[str, Any]]) -> None:
            return None

        limited = ProviderConfig(
            id=provider.id,
            endpoint=provider.endpoint,
            stream=False,
            connect_timeout=min(provider.connect_timeout, deadline),
            read_timeout=deadline,
            total_timeout=deadline,
        )
        with contextlib.suppress(UpstreamError):
            await self.call(
                limited, endpoint, authorization, "session.cancel", params, noop, stream=False
            )


async def _deliver(events: list[Event], on_notifications: OnNotifications) -> None:
    notes = [event.message for event in events if isinstance(event, Notification)]
    if notes:
        await on_notifications(notes)
