"""One JSON-RPC call to an upstream ACP provider, sans I/O (forwarding.md §4.4-4.6).

:class:`UpstreamCall` builds the request envelope and sorts what comes back into
events, the same way whichever transport carried it: a plain-JSON HTTP body
(:meth:`~UpstreamCall.body`), SSE bytes (:meth:`~UpstreamCall.sse`) or WebSocket
messages (:meth:`~UpstreamCall.message`). The I/O (``upstream.py``) only moves
bytes and acts on the events; everything that decides what a frame *is* lives
here, and is tested without sockets.

Frame rules, for every transport:

* a JSON object with ``result`` or ``error`` and no ``method`` is the response
  (its ``id`` should be ours; upstreams that echo another id are tolerated, since
  each call has its own HTTP exchange or socket); a non-empty ``error`` object
  fails the call with its ``message``;
* a JSON object with a ``method`` and no ``id`` is a notification, relayed;
* anything else (bad JSON, an array, a request from the upstream, ``[DONE]``)
  is ignored;
* a frame nested deeper than :data:`~xwm_bridge.jsonrpc.MAX_DEPTH` levels is
  never relayed nor kept: if it is the response, the call fails with a protocol
  error; otherwise it is ignored.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.sse import SSEDecodeError, SSEDecoder

REMOTE_ERROR_DEFAULT: Final = "external ACP request failed"
TOO_DEEP: Final = f"invalid upstream response: nested deeper than {jsonrpc.MAX_DEPTH} levels"
#: a frame gets one level more than its params/result (the envelope itself)
_FRAME_DEPTH: Final = jsonrpc.MAX_DEPTH + 1
_counter = itertools.count(1)


def new_request_id() -> str:
    # unique even when two calls share a nanosecond (the original used the clock only)
    return f"req-{time.time_ns()}-{next(_counter)}"


class UpstreamProtocolError(Exception):
    """The upstream broke the protocol; ``str()`` is the error text of the turn.

    ``kind`` is the metrics label: ``protocol``, ``http_status`` or ``remote_error``.
    """

    def __init__(self, message: str, kind: str = "protocol") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Notification:
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Response:
    envelope: dict[str, Any]


Event = Notification | Response


def remote_error(obj: Mapping[str, Any]) -> str | None:
    """The ``message`` of a non-empty ``error`` object, else None."""
    err = obj.get("error")
    if isinstance(err, dict) and err:
        return coerce.text(err.get("message"), REMOTE_ERROR_DEFAULT)
    return None


def classify(obj: Any) -> Event | None:
    """Sort one decoded frame (see the module docstring); raise on an error response."""
    if not isinstance(obj, dict):
        return None
    if "method" in obj:
        if obj.get("id") is None and coerce.text(obj.get("method")):
            return Notification(obj)
        return None
    if "result" in obj or "error" in obj:
        message = remote_error(obj)
        if message is not None:
            raise UpstreamProtocolError(message, "remote_error")
        return Response(obj)
    return None


def _is_response(obj: Any) -> bool:
    return isinstance(obj, dict) and "method" not in obj and ("result" in obj or "error" in obj)


def _loads(data: bytes | str) -> Any:
    """The decoded frame, None to ignore it; raise when the response is too deep."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if jsonrpc.may_nest(data, _FRAME_DEPTH) and jsonrpc.nesting_exceeds(obj, _FRAME_DEPTH):
        if _is_response(obj):
            raise UpstreamProtocolError(TOO_DEEP)
        return None  # a notification nobody could write back: not relayed
    return obj


class UpstreamCall:
    """The state of one call: its request, and the response once it has arrived."""

    def __init__(self, method: str, params: Mapping[str, Any], *, rid: str | None = None) -> None:
        self.rid = rid or new_request_id()
        self.method = method
        #: the request envelope, encoded once
        self.request = orjson.dumps(jsonrpc.request(self.rid, method, params))
        self.response: dict[str, Any] | None = None
        self._sse: SSEDecoder | None = None

    def _take(self, event: Event | None, out: list[Event]) -> None:
        if event is None or self.response is not None:
            return  # after the response nothing more counts
        if isinstance(event, Response):
            self.response = event.envelope
        out.append(event)

    def body(self, data: bytes, status: int) -> Response:
        """A plain-JSON HTTP answer: the whole body is the response envelope."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if not 200 <= status < 300:
                snippet = data[:200].decode("utf-8", "replace").strip()
                raise UpstreamProtocolError(
                    f"upstream answered HTTP {status}: {snippet}", "http_status"
                ) from None
            raise UpstreamProtocolError(f"invalid upstream response: {exc}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError("invalid upstream response: not a JSON object")
        if jsonrpc.may_nest(data, _FRAME_DEPTH) and jsonrpc.nesting_exceeds(obj, _FRAME_DEPTH):
            raise UpstreamProtocolError(TOO_DEEP)
        message = remote_error(obj)
        if message is not None:
            raise UpstreamProtocolError(message, "remote_error")
        self.response = obj
        return Response(obj)

    def sse(self, chunk: bytes, *, max_line: int) -> list[Event]:
        """Bytes of an SSE answer; the events they complete, in order."""
        if self._sse is None:
            self._sse = SSEDecoder(max_line=max_line)
        try:
            datas = self._sse.feed(chunk) if chunk else self._sse.flush()
        except SSEDecodeError as exc:
            raise UpstreamProtocolError(f"invalid upstream stream: {exc}") from None
        out: list[Event] = []
        for data in datas:
            if self.response is not None:
                break
            if data.strip() != b"[DONE]":
                self._take(classify(_loads(data)), out)
        if not chunk and self.response is None:
            raise UpstreamProtocolError("upstream stream ended without a response")
        return out

    def message(self, data: bytes | str) -> list[Event]:
        """One WebSocket message."""
        out: list[Event] = []
        self._take(classify(_loads(data)), out)
        return out
