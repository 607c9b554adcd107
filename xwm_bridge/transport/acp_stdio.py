"""``xwm-bridge acp``: the bridge as an ACP agent on stdin/stdout.

Newline-delimited JSON-RPC (ACP's stdio transport; ``Content-Length`` frames are
accepted too). One ACP connection for the life of the process. Requests run
concurrently, so ``session/cancel`` overtakes a running prompt. A malformed line
gets a JSON-RPC error (id null) and the stream goes on; one past the size limit is
answered by the id its first bytes hold (:func:`~xwm_bridge.acp.codec.too_large`).
At end of input the requests still running get ``limits.shutdown_grace`` to answer,
then the connection closes (its turns are cancelled by the bridge's shutdown).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from xwm_bridge import jsonrpc
from xwm_bridge.acp import codec
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.framing import FramingError, StdioDecoder
from xwm_bridge.tasks import wait_for
from xwm_bridge.transport.notify import OrderedSender

log = logging.getLogger("xwm_bridge.acp")


async def serve_acp_stdio(
    front: AcpFrontDoor,
    read: Callable[[], Awaitable[bytes]],
    write: Callable[[bytes], Awaitable[None]],
    *,
    max_message: int,
    send_timeout: float,
    grace: float,
) -> None:
    sender = OrderedSender(write, timeout=send_timeout)

    wire = front.wire

    async def send(message: dict[str, Any], scope: str | None) -> None:
        data = wire.encode(message)  # secrets redacted; never raises
        if data is not None:
            await sender.send_bytes(data + b"\n")

    conn = front.connect(send, transport="acp-stdio", principal="acp-stdio")
    decoder = StdioDecoder(max_message=max_message)
    try:
        while True:
            chunk = await read()
            for item in decoder.feed(chunk) if chunk else decoder.eof():
                if isinstance(item, FramingError) and item.head:  # answered by its id
                    await conn.take(codec.too_large(item.head, item.message))
                elif isinstance(item, FramingError):
                    await send(jsonrpc.error(None, jsonrpc.PARSE_ERROR, item.message), None)
                else:
                    await conn.receive(item)
            if not chunk:
                break
        try:
            await wait_for(conn.wait_idle(), grace)
        except TimeoutError:
            log.info("end of input: requests still running are cancelled")
    finally:
        await conn.close()
