"""Calls to upstream ACP providers over HTTP (JSON or SSE) and WebSocket (forwarding.md §4.4-4.5).

The I/O half of :mod:`.upstream_call`: it moves bytes and acts on the events the
call object sorts them into. Better than the original: every call has connect,
read and total deadlines; an HTTP upstream that answers with SSE is streamed
through; a plain-JSON answer is read to its end (or to the size cap); the
connection pool is shared and kept alive; cancellation closes the upstream
request and :meth:`UpstreamClient.send_cancel` tells the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import websockets
from websockets.asyncio.client import connect as ws_connect

from xwm_bridge import httpbody
from xwm_bridge.config import ProviderConfig
from xwm_bridge.endpoint import Endpoint
from xwm_bridge.providers.upstream_call import (
    Notification,
    UpstreamCall,
    UpstreamProtocolError,
)

__all__ = ["MAX_UPSTREAM_RESPONSE", "UpstreamClient", "UpstreamError"]

OnNotification = Callable[[dict[str, Any]], Awaitable[None]]
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


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, or :class:`UpstreamError` past ``cap`` bytes (``content.read(n)``
    returns only what is buffered, which cut long answers short)."""
    try:
        return await httpbody.read_capped(resp, cap)
    except httpbody.BodyTooLarge:
        raise UpstreamError("upstream response too large") from None


class UpstreamClient:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http
        self._timeouts: dict[tuple[float, float], aiohttp.ClientTimeout] = {}

    def _timeout(self, provider: ProviderConfig) -> aiohttp.ClientTimeout:
        key = (provider.connect_timeout, provider.read_timeout)
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, sock_connect=key[0], sock_read=key[1]
            )
        return timeout

    async def call(
        self,
        provider: ProviderConfig,
        endpoint: Endpoint,
        authorization: str,
        method: str,
        params: Mapping[str, Any],
        on_notification: OnNotification,
        *,
        stream: bool = True,
    ) -> dict[str, Any]:
        """Send one request; return the upstream response envelope or raise UpstreamError.

        ``stream`` asks an HTTP upstream for SSE (``Accept: text/event-stream``).
        """
        call = UpstreamCall(method, params)
        try:
            async with asyncio.timeout(provider.total_timeout):
                if endpoint.transport == "ws":
                    return await self._call_ws(
                        provider, endpoint.ws_url, authorization, call, on_notification
                    )
                return await self._call_http(
                    provider, endpoint.http_url, authorization, call, on_notification, stream
                )
        except TimeoutError:
            raise UpstreamError(
                f"upstream {provider.id} timed out (no answer within the configured deadline)",
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
        on_notification: OnNotification,
        stream: bool,
    ) -> dict[str, Any]:
        headers = {"Content-Type": "application/json; charset=utf-8"}
        headers["Accept"] = _JSON_OR_SSE if stream else _JSON
        if authorization:
            headers["Authorization"] = authorization
        try:
            async with self._http.post(
                url, data=call.request, headers=headers, timeout=self._timeout(provider)
            ) as resp:
                if resp.content_type == "text/event-stream":
                    return await self._read_sse(resp, call, on_notification)
                body = await read_capped(resp, MAX_UPSTREAM_RESPONSE)
                return call.body(body, resp.status).envelope
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"POST {url}: {_describe(exc)}",
                timed_out=isinstance(exc, TimeoutError),
                kind="" if isinstance(exc, TimeoutError) else "transport",
            ) from None
        except TimeoutError:
            raise UpstreamError(
                f"POST {url}: upstream did not answer in time", timed_out=True
            ) from None

    @staticmethod
    async def _read_sse(
        resp: aiohttp.ClientResponse, call: UpstreamCall, on_notification: OnNotification
    ) -> dict[str, Any]:
        content = resp.content
        while True:
            chunk = await content.readany()
            for event in call.sse(chunk, max_line=MAX_UPSTREAM_RESPONSE):
                if isinstance(event, Notification):
                    await on_notification(event.message)
            if call.response is not None:
                return call.response

    @staticmethod
    async def _call_ws(
        provider: ProviderConfig,
        url: str,
        authorization: str,
        call: UpstreamCall,
        on_notification: OnNotification,
    ) -> dict[str, Any]:
        headers = {"Authorization": authorization} if authorization else None
        try:
            async with ws_connect(
                url,
                additional_headers=headers,
                open_timeout=provider.connect_timeout,
                max_size=MAX_UPSTREAM_RESPONSE,
                compression=None,
                proxy=None,
            ) as ws:
                await ws.send(call.request.decode())  # JSON goes out as a text frame
                while True:
                    try:
                        raw = await asyncio.wait_for(ws.recv(), provider.read_timeout)
                    except TimeoutError:
                        raise UpstreamError(
                            f"{url}: no message from upstream for {provider.read_timeout:g}s",
                            timed_out=True,
                        ) from None
                    for event in call.message(raw):
                        if isinstance(event, Notification):
                            await on_notification(event.message)
                    if call.response is not None:
                        return call.response
        except websockets.exceptions.WebSocketException as exc:
            raise UpstreamError(f"{url}: {_describe(exc)}", kind="transport") from None
        except OSError as exc:
            raise UpstreamError(f"{url}: {_describe(exc)}", kind="transport") from None

    async def send_cancel(
        self,
        provider: ProviderConfig,
        endpoint: Endpoint,
        authorization: str,
        params: dict[str, Any],
        deadline: float,
    ) -> None:
        """Tell the provider to cancel ``params['sessionId']``; best effort, bounded."""

        async def noop(_: dict[str, Any]) -> None:
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


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
