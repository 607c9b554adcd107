"""Requests refused before they reach a method: counted and logged (issue 15).

Every refusal — a bad or missing token, a foreign origin, a body that is too
large or is not JSON-RPC, a rate limit — increments
``xwm_rejected_requests_total{transport, reason}`` and writes one
``"msg":"request rejected"`` line (never the credential, the body or headers).
"""

from __future__ import annotations

from typing import Any

from xwm_bridge.observability.logging import events
from xwm_bridge.observability.metrics import Metrics

LOGGER = "xwm_bridge.rejected"

MISSING_TOKEN = "missing_token"
INVALID_TOKEN = "invalid_token"
ORIGIN = "origin"
BODY_TOO_LARGE = "body_too_large"
BAD_BODY = "bad_body"
PARSE_ERROR = "parse_error"
METHOD_NOT_ALLOWED = "method_not_allowed"
MESSAGE_TOO_LARGE = "message_too_large"
TOO_MANY_INFLIGHT = "too_many_inflight"
#: ``/acp/remote`` at ``acp.max_connections`` (503)
TOO_MANY_CONNECTIONS = "too_many_connections"
RATE_LIMITED = "rate_limited"
FOREIGN_BRIDGE = "foreign_bridge"
#: an id or params nested past jsonrpc.MAX_DEPTH (issue 16)
TOO_DEEP = "too_deep"
#: bytes the HTTP parser refused, and a request head over the front's limit
#: (transport/front.py; aiohttp answers and logs its own)
BAD_REQUEST = "bad_request"
HEAD_TOO_LARGE = "head_too_large"
#: a ``Transfer-Encoding`` other than a lone ``chunked`` (codings.py: 501 or 400)
CODING = "transfer_coding"
#: a ``Host`` a bridge without a token does not serve (DNS rebinding; 421)
HOST_NOT_ALLOWED = "host_not_allowed"


def decode_reason(code: int) -> str:
    """The reason label of a ``jsonrpc.DecodeError``: bad JSON, or nesting past the cap."""
    return PARSE_ERROR if code == -32700 else TOO_DEEP


def reject(metrics: Metrics, transport: str, reason: str, **fields: Any) -> None:
    """Count and log one refused request (``fields``: status, remote, path, …)."""
    metrics.rejections.get(transport, reason).inc()
    events.info(LOGGER, "request rejected", {"transport": transport, "reason": reason, **fields})
