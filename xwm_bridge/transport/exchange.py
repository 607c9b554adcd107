"""What ``/acp/rpc`` needs of an HTTP server, whichever one parsed the request.

Two servers answer ``POST /acp/rpc``: the protocol-level front (``front.py``)
for connections that start with it, and aiohttp for every other connection
(``http.py``). Both hand the method logic a :class:`RequestView` and get back
a :class:`Reply` (a complete answer) or write an SSE answer through a
:class:`StreamOut`. This module imports neither server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

#: read-only: the front writes its lines from a copy encoded once (``front_wire.py``)
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})
SSE_HEADERS: Mapping[str, str] = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}
#: the SSE headers of an answer to a request that asked to close (``Connection:
#: close``, HTTP/1.0 without keep-alive): :data:`SSE_HEADERS` said ``keep-alive`` on a
#: connection closed after the answer (the original's Go server replaces the field)
SSE_CLOSE_HEADERS: Mapping[str, str] = {**SSE_HEADERS, "Connection": "close"}


def sse_headers(keep_alive: bool) -> Mapping[str, str]:
    """:data:`SSE_HEADERS`, or :data:`SSE_CLOSE_HEADERS` for a request that asked to close."""
    return SSE_HEADERS if keep_alive else SSE_CLOSE_HEADERS


#: an SSE comment line: keeps proxies with idle timeouts from cutting a silent stream
SSE_KEEPALIVE = b": keep-alive\n\n"
CORS_HEADERS: Mapping[str, str] = {
    "Access-Control-Allow-Methods": "POST, OPTIONS",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept",
    "Access-Control-Max-Age": "600",
}
#: sent as three ``Vary`` lines with every CORS answer
VARY = ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers")


class RequestView(Protocol):
    """The parts of a request the method logic reads (``aiohttp.web.Request`` has them)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def remote(self) -> str | None: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Looked up case-insensitively."""

    @property
    def transport(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete HTTP answer: status, body and headers (CORS headers not included)."""

    status: int
    body: bytes
    headers: Mapping[str, str]


class StreamOut(Protocol):
    """The SSE answer to one request: the head leaves with the first write."""

    async def write(self, data: bytes, *, last: bool = False) -> None:
        """Send ``data`` (``last``: and finish the answer with it); raises
        ``ConnectionError`` once the client is gone."""

    async def end(self) -> None:
        """Finish the answer unless a ``last`` write did (an answer never written is
        sent empty); never raises."""
