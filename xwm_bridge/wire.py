"""What goes out to a client: every JSON-RPC message is encoded here, once.

Two guarantees at every client boundary (HTTP, SSE, WebSocket, stdio, the
catch-up stream, the toolbridge):

* no configured secret leaves the bridge: string values are redacted
  (:class:`~xwm_bridge.observability.redact.Redactor`), which covers error texts
  and upstream bodies relayed to the client;
* encoding never raises. A response that cannot be encoded (orjson writes at
  most 254 levels of nesting; input is capped far below, so this is the last
  net) becomes a ``-32603`` error with the request's id; a notification that
  cannot be encoded is dropped, and both are logged.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from xwm_bridge import jsonrpc
from xwm_bridge.observability.redact import Redactor

log = logging.getLogger("xwm_bridge.wire")
UNENCODABLE = "internal error: the reply could not be encoded"


class WireEncoder:
    """Encodes messages for one front end; ``dropped`` counts what could not be sent."""

    def __init__(self, secrets: Redactor | tuple[str, ...] = ()) -> None:
        self.redactor = secrets if isinstance(secrets, Redactor) else Redactor(secrets)
        self.dropped = 0

    def encode(self, message: dict[str, Any]) -> bytes | None:
        """The message's JSON, or its ``-32603`` stand-in, or None for a notification
        that cannot be encoded."""
        try:
            return self.redactor.dumps(message)
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            self.dropped += 1
            is_response = "id" in message and ("result" in message or "error" in message)
            log.warning(
                "message to the client could not be encoded",
                extra={
                    "error": str(exc),
                    "method": str(message.get("method", ""))[:128],
                    "response": is_response,
                },
            )
            if not is_response:
                return None
            rid = message.get("id")
            try:
                return orjson.dumps(jsonrpc.error(rid, jsonrpc.INTERNAL_ERROR, UNENCODABLE))
            except TypeError:
                return orjson.dumps(jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, UNENCODABLE))

    def events(self, messages: list[dict[str, Any]]) -> bytes:
        """The SSE events (``data: <json>``) of ``messages``, in one chunk: as
        :meth:`encode` each, but the secret check runs once over the chunk (a chunk
        without any secret holds no message with one; otherwise, or when one cannot be
        encoded, message by message)."""
        try:
            parts: list[bytes] = []
            for message in messages:
                parts += (b"data: ", orjson.dumps(message), b"\n\n")
        except (TypeError, ValueError):
            parts = []
        else:
            data = b"".join(parts)
            if not self.redactor.hit(data):
                return data
        encoded = [self.encode(m) for m in messages]
        return b"".join([b"data: " + e + b"\n\n" for e in encoded if e is not None])


#: for front ends that have no configured secrets (tests, library use)
PLAIN = WireEncoder()
