"""Reading an aiohttp response body to its end, or to a size cap.

``resp.content.read(n)`` returns only what is buffered at that moment, so a
long answer (anything past about 100 KB, depending on the network) was cut
short and failed as "unexpected end of data". Every body the bridge reads
from a peer goes through :func:`read_capped`.
"""

from __future__ import annotations

import aiohttp


class BodyTooLarge(Exception):
    """The body is longer than the cap; ``str()`` names the cap."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"response larger than {cap} bytes")
        self.cap = cap


async def read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` past ``cap`` bytes (without reading
    more than ``cap`` plus one chunk)."""
    if resp.content_length is not None and resp.content_length > cap:
        raise BodyTooLarge(cap)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:
            raise BodyTooLarge(cap)
        chunks.append(chunk)
