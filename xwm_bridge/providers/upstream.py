"""Calls to upstream ACP providers over HTTP (JSON or SSE) and WebSocket (forwarding.md §4.4-4.5).

Better than the original: every call has connect, read and total deadlines; an
HTTP upstream that answers with SSE is streamed through; a WebSocket response
with ``"result": null`` is recognised; cancellation closes the upstream
request and :meth:`UpstreamClient.send_cancel` tells the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import websockets
from websockets.asyncio.client import connect as ws_connect

from xwm_bridge import coerce
from xwm_bridge.config import ProviderConfig
from xwm_bridge.providers.endpoint import Endpoint
from xwm_bridge.sse import SSEDecodeError, SSEDecoder

OnNotification = Callable[[dict[str, Any]], Awaitable[None]]
MAX_UPSTREAM_RESPONSE = 64 * 1024 * 1024
_counter = itertools.count(1)


class UpstreamError(Exception):
    """A failed upstream call; ``str()`` is the error text put in the result."""

    def __init__(self, message: str, *, timed_out: bool = False, kind: str = "") -> None:
        super().__init__(message)
        self.timed_out = timed_out
        #: metrics label: timeout, transport, http_status, protocol or remote_error
        self.kind = kind or ("timeout" if timed_out else "protocol")


def new_request_id() -> str:
    # unique even when two calls share a nanosecond (the original used the clock only)
    return f"req-{time.time_ns()}-{next(_counter)}"


def _envelope(rid: str, method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


def _error_of(obj: dict[str, Any]) -> str | None:
    err = obj.get("error")
    if isinstance(err, dict) and err:
        return coerce.text(err.get("message"), "external ACP request failed")
    return None


def _is_response(obj: dict[str, Any], rid: str) -> bool:
    return coerce.text(obj.get("id")) == rid and ("result" in obj or "error" in obj)


def _is_notification(obj: dict[str, Any]) -> bool:
    return bool(coerce.text(obj.get("method"))) and obj.get("id") is None


class UpstreamClient:
    def __init__(self, http: aiohttp.ClientSession) -> None:
        self._http = http

    async def call(
        self,
        provider: ProviderConfig,
        endpoint: Endpoint,
        authorization: str,
        method: str,
        params: dict[str, Any],
        on_notification: OnNotification,
        *,
        stream: bool = True,
    ) -> dict[str, Any]:
        """Send one request; return the upstream response envelope or raise UpstreamError.

        ``stream`` asks an HTTP upstream for SSE (``Accept: text/event-stream``).
        """
        try:
            async with asyncio.timeout(provider.total_timeout):
                if endpoint.transport == "ws":
                    return await self._call_ws(
                        provider, endpoint.ws_url, authorization, method, params, on_notification
                    )
                return await self._call_http(
                    provider,
                    endpoint.http_url,
                    authorization,
                    method,
                    params,
                    on_notification,
                    stream,
                )
        except TimeoutError:
            raise UpstreamError(
                f"upstream {provider.id} timed out (no answer within the configured deadline)",
                timed_out=True,
            ) from None

    async def _call_http(
        self,
        provider: ProviderConfig,
        url: str,
        authorization: str,
        method: str,
        params: dict[str, Any],
        on_notification: OnNotification,
        stream: bool,
    ) -> dict[str, Any]:
        rid = new_request_id()
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "Accept": "application/json, text/event-stream" if stream else "application/json",
        }
        if authorization:
            headers["Authorization"] = authorization
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=provider.connect_timeout, sock_read=provider.read_timeout
        )
        try:
            async with self._http.post(
                url, data=_envelope(rid, method, params), headers=headers, timeout=timeout
            ) as resp:
                if resp.content_type == "text/event-stream":
                    return await self._read_sse(resp, rid, on_notification)
                body = await resp.content.read(MAX_UPSTREAM_RESPONSE + 1)
                if len(body) > MAX_UPSTREAM_RESPONSE:
                    raise UpstreamError("upstream response too large")
                return self._decode_body(body, resp.status)
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
    def _decode_body(body: bytes, status: int) -> dict[str, Any]:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if not 200 <= status < 300:
                snippet = body[:200].decode("utf-8", "replace").strip()
                raise UpstreamError(
                    f"upstream answered HTTP {status}: {snippet}", kind="http_status"
                ) from None
            raise UpstreamError(f"invalid upstream response: {exc}") from None
        if not isinstance(obj, dict):
            raise UpstreamError("invalid upstream response: not a JSON object")
        err = _error_of(obj)
        if err is not None:
            raise UpstreamError(err, kind="remote_error")
        return obj

    async def _read_sse(
        self, resp: aiohttp.ClientResponse, rid: str, on_notification: OnNotification
    ) -> dict[str, Any]:
        decoder = SSEDecoder()
        try:
            async for chunk in resp.content.iter_any():
                for data in decoder.feed(chunk):
                    final = await self._sse_event(data, rid, on_notification)
                    if final is not None:
                        return final
            for data in decoder.flush():
                final = await self._sse_event(data, rid, on_notification)
                if final is not None:
                    return final
        except SSEDecodeError as exc:
            raise UpstreamError(f"invalid upstream stream: {exc}") from None
        raise UpstreamError("upstream stream ended without a response")

    async def _sse_event(
        self, data: bytes, rid: str, on_notification: OnNotification
    ) -> dict[str, Any] | None:
        if data.strip() == b"[DONE]":
            return None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None  # a malformed event is skipped, as on the WebSocket path
        if not isinstance(obj, dict):
            return None
        if _is_response(obj, rid) or (("result" in obj or "error" in obj) and "method" not in obj):
            err = _error_of(obj)
            if err is not None:
                raise UpstreamError(err, kind="remote_error")
            return obj
        if _is_notification(obj):
            await on_notification(obj)
        return None

    async def _call_ws(
        self,
        provider: ProviderConfig,
        url: str,
        authorization: str,
        method: str,
        params: dict[str, Any],
        on_notification: OnNotification,
    ) -> dict[str, Any]:
        rid = new_request_id()
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
                await ws.send(_envelope(rid, method, params).decode())
                while True:
                    try:
                        raw = await asyncio.wait_for(ws.recv(), provider.read_timeout)
                    except TimeoutError:
                        raise UpstreamError(
                            f"{url}: no message from upstream for {provider.read_timeout:g}s",
                            timed_out=True,
                        ) from None
                    try:
                        obj = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        continue
                    if not isinstance(obj, dict):
                        continue
                    if _is_response(obj, rid):
                        err = _error_of(obj)
                        if err is not None:
                            raise UpstreamError(err, kind="remote_error")
                        return obj
                    if coerce.text(obj.get("method")):
                        await on_notification(obj)
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
