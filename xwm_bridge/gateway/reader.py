"""Reading one gateway socket until it is lost (gateway.md §5.2, §8.2): responses go to
their requests, events to the runtime's handler (``events.Events``), frames it cannot
use are counted (``ignored.IgnoredFrames``).

Tick liveness: silence for 2× the gateway's ``tickIntervalMs`` (at most
:data:`MAX_TICK_MS` of it) counts as a dead socket, as does the gateway announcing
``shutdown``. The runtime's loop then drops the socket and reconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import websockets
from websockets.asyncio.client import ClientConnection

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.ignored import IgnoredFrames
from xwm_bridge.gateway.notices import Notices
from xwm_bridge.gateway.requests import Requests
from xwm_bridge.gateway.snapshot import Snapshot
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.gateway")

#: the most of the gateway's announced ``tickIntervalMs`` liveness trusts: a huge one
#: would switch it off (pings are off, so a half-open socket would stay "connected")
MAX_TICK_MS = 300_000


def silence_within(hello: p.Hello | None) -> float:
    """How long a socket may stay silent before it counts as dead (seconds)."""
    tick_ms = min(hello.tick_interval_ms if hello else 30_000, MAX_TICK_MS)
    return max(2 * tick_ms / 1000, 0.2)


async def read(
    ws: ClientConnection,
    hello: p.Hello | None,
    *,
    requests: Requests,
    ignored: IgnoredFrames,
    on_event: Callable[[p.EventFrame], bool],
    notices: Notices,
) -> None:
    """Read until the socket is closed, silent too long, or ``on_event`` says the
    gateway is going away.

    A bug in handling one frame (``on_event``, a request's delivery) is logged with its
    traceback and the frame skipped: the read goes on, so the socket's other waiters
    (turns, requests) are not left behind a reader that died with the socket up."""
    silence = silence_within(hello)
    while True:
        try:
            data = await wait_for(ws.recv(), silence)
        except TimeoutError:
            notices.log("warn", "socket", f"no frame for {silence:.1f}s; reconnecting")
            return
        except websockets.ConnectionClosed:
            return
        try:
            frame = p.decode_frame(data)
            if frame is None:
                ignored.note(p.ignored_reason(data), data)
            elif isinstance(frame, p.ResponseFrame):
                if not requests.deliver(frame):  # unknown, duplicate, or too late
                    ignored.note("unknown_response", data)
            elif isinstance(frame, p.EventFrame):
                if on_event(frame):
                    return
                await asyncio.sleep(0)  # the writers' turn: a burst must not fill outboxes
        except Exception:
            log.error(
                "gateway frame handling failed",
                exc_info=True,
                extra={"runtime_id": ignored.runtime_id},
            )


def lost(snapshot: Snapshot, notices: Notices) -> None:
    """The socket the runtime read is gone: say so (log, ``error`` snapshot)."""
    notices.log("warn", "socket", "closed by gateway")
    snapshot.status, snapshot.status_text = "error", "Disconnected"
    snapshot.last_error, snapshot.last_error_code = "Gateway connection closed", "SOCKET_CLOSED"
    notices.snapshot(snapshot)
