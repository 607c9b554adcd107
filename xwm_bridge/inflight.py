"""How many requests one client connection may have running, and which pass anyway.

One value bounds a WebSocket (``GET /acp``), the stdio stream and every ACP
connection (stdio, ``/acp/remote``); the console's WebSocket has a smaller one of
its own, with the same rule. Transports read it at each request, so a
test can lower it in one place. Past the limit a WebSocket or ACP request is
answered ``-32004`` (a notification is dropped and counted); the stdio stream,
which cannot refuse what it has not read, reads ahead a few requests and then
stops reading. Cancels pass the limit, up to twice it: a client whose slots are
all taken by running turns can still cancel them.
"""

from __future__ import annotations

from typing import Any

from xwm_bridge import jsonrpc

MAX_INFLIGHT_PER_CONNECTION = 256
#: methods that end work (the bridge's and ACP's cancel)
CANCEL_METHODS = frozenset(("session.cancel", "session/cancel", "$/cancel_request"))


def admits(inflight: int, method: str, limit: int | None = None) -> bool:
    """Whether a connection with ``inflight`` requests running may start ``method``
    (``limit``: the connection's own, else :data:`MAX_INFLIGHT_PER_CONNECTION`)."""
    limit = MAX_INFLIGHT_PER_CONNECTION if limit is None else limit
    return inflight < limit or (method in CANCEL_METHODS and inflight < 2 * limit)


def refusal(request_id: Any, limit: int | None = None) -> dict[str, Any]:
    """The answer to a request past the limit."""
    limit = MAX_INFLIGHT_PER_CONNECTION if limit is None else limit
    return jsonrpc.error(
        request_id,
        jsonrpc.QUEUE_FULL,
        f"too many requests in flight on this connection (limit {limit})",
    )
