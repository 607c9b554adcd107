"""Opening a gateway socket and driving the sans-I/O handshake over it (the I/O half of
``protocol.Handshake``; ``attempts.attempt`` puts them together).

Every wait has a deadline: the dial ``connect_timeout``, the challenge
``challenge_timeout``, and the ``connect`` frame's write and the hello
``hello_timeout``. A failed dial tells the client only :data:`DIAL_FAILED`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import websockets
from websockets.asyncio.client import ClientConnection

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.proxy import ProxySettings, ws_error
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.gateway")

#: the one text a client sees for any failed dial (never the OS reason)
DIAL_FAILED = "gateway connection failed"

#: told of each frame the handshake drops: its reason (``protocol.IGNORED_REASONS``)
#: and the frame (``ignored.IgnoredFrames.note``)
Ignored = Callable[[str, str | bytes], None]


async def open_socket(
    url: str, s: GatewayConfig, runtime_id: str, proxies: ProxySettings | None = None
) -> ClientConnection:
    """The socket, through the forward proxy ``proxies`` names for ``url`` (a CONNECT
    tunnel; ``connect_timeout`` bounds it all) or direct; never websockets' own reading
    of the environment."""
    route = proxies.for_url(url) if proxies is not None else None
    try:
        return await websockets.connect(
            url,
            open_timeout=s.connect_timeout,
            max_size=s.max_message_bytes,
            ping_interval=None,
            close_timeout=2,
            proxy=route.url if route is not None else None,
        )
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        # the reason (refused, timed out, not a WebSocket, TLS, the proxy's refusal)
        # stays in our log: in the client's answer it would tell open ports from closed
        # ones. The proxy appears by address only, never with its credentials.
        error = (
            "TimeoutError: no answer in time"
            if isinstance(exc, TimeoutError)
            else (f"{type(exc).__name__}: {ws_error(exc, route)}")
        )
        extra = {"runtime_id": runtime_id, "error": error}
        if route is not None:
            extra["proxy"] = route.display
        log.info("gateway dial failed", extra=extra)
        raise GatewayError(DIAL_FAILED, "SOCKET_FAILURE") from None


async def connect(
    url: str,
    hs: p.Handshake,
    s: GatewayConfig,
    runtime_id: str,
    proxies: ProxySettings | None = None,
    ignored: Ignored | None = None,
) -> tuple[ClientConnection, p.Hello]:
    """Open the socket and run ``hs`` over it: the socket and its ``hello-ok``, or the
    handshake's :class:`GatewayError` with the socket closed (also when cancelled)."""
    ws = await open_socket(url, s, runtime_id, proxies)
    try:
        await handshake(ws, hs, s, ignored)
    except BaseException:
        await close_quietly(ws)
        raise
    if hs.state is not p.HandshakeState.CONNECTED or hs.hello is None:
        await close_quietly(ws)
        raise hs.error or GatewayError("socket closed", "SOCKET_CLOSED")
    return ws, hs.hello


async def handshake(
    ws: ClientConnection, hs: p.Handshake, s: GatewayConfig, ignored: Ignored | None = None
) -> None:
    """Feed ``hs`` the socket's frames and write what it answers, until it is connected
    or has failed (its ``state`` and ``error`` say which). A frame that is none
    (``decode_frame``) or a ``res`` that is not the ``connect``'s goes to ``ignored``,
    as the runtime's reader does after the handshake; other events are the gateway's
    to send (ticks, health) and are dropped uncounted."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + s.challenge_timeout
    while hs.state in (p.HandshakeState.AWAIT_CHALLENGE, p.HandshakeState.AWAIT_HELLO):
        remaining = deadline - loop.time()
        if remaining <= 0:
            hs.on_timeout()
            return
        try:
            data = await wait_for(ws.recv(), remaining)
        except TimeoutError:
            hs.on_timeout()
            return
        except websockets.ConnectionClosed as exc:
            _closed(hs, exc)
            return
        frame = p.decode_frame(data)
        if frame is None:
            if ignored is not None:
                ignored(p.ignored_reason(data), data)
            continue
        awaited = hs.state is p.HandshakeState.AWAIT_HELLO
        if isinstance(frame, p.ResponseFrame) and not (awaited and frame.id == hs.request_id):
            if ignored is not None:
                ignored("unknown_response", data)
            continue
        out = hs.on_frame(frame)
        if out is not None:
            deadline = loop.time() + s.hello_timeout  # the write of connect included
            try:
                await wait_for(ws.send(out, text=True), s.hello_timeout)  # a text frame
            except TimeoutError:  # a gateway that does not read
                hs.on_timeout()
                return
            except websockets.ConnectionClosed as exc:
                _closed(hs, exc)  # right after the challenge: a failed attempt, not a crash
                return


def _closed(hs: p.Handshake, exc: websockets.ConnectionClosed) -> None:
    rcvd = exc.rcvd
    hs.on_close(rcvd.code if rcvd else None, rcvd.reason if rcvd else "")


async def close_quietly(ws: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        await wait_for(ws.close(), 2.0)
