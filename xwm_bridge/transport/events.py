"""``GET /acp/sessions/{sessionId}/events``: the SSE catch-up stream (issue 6).

Additive to the original contract. A client that lost its stream reconnects
here with ``Last-Event-ID: <seq>`` (or ``?afterSeq=<seq>``) and receives, as
``id: <seq>`` + ``data: <notification>`` events, everything the session's
ledger holds after that seq; with ``?follow=1`` the stream then stays open and
carries the session's new notifications live, with ``: keep-alive`` comments,
until the client leaves, falls too far behind, the bridge shuts down or
``FOLLOW_MAX_SECONDS`` pass. Each event's id is the seq of the bridge update it
is or follows, so a reconnect resumes exactly after the last bridge update seen
(upstream frames relayed after it may be delivered again).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.core.feed import Subscription
from xwm_bridge.transport.notify import OrderedSender
from xwm_bridge.wire import PLAIN, WireEncoder

KEEPALIVE_SECONDS = 15.0
FOLLOW_MAX_SECONDS = 3600.0
#: as session.replay's afterSeq: ledger positions (2·seq + 1) stay within int64
MAX_SEQ = 2**62 - 1
BAD_AFTER = "afterSeq / Last-Event-ID must be a non-negative integer"


def event_bytes(pos: int, message: dict[str, Any], wire: WireEncoder = PLAIN) -> bytes | None:
    """One SSE event: ``id:`` is the bridge seq the entry is or follows (None when the
    message cannot be encoded)."""
    data = wire.encode(message)
    if data is None:
        return None
    return b"id: %d\ndata: " % (pos // 2) + data + b"\n\n"


def parse_after(header: str | None, query: str | None) -> int | None:
    """The position to resume after; None when it is not ASCII digits up to MAX_SEQ
    (``str.isdigit`` alone also accepts "²" and "٣", which ``int()`` refuses or reads;
    a longer number overflowed the store's integer)."""
    raw = (header or query or "0").strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        return None
    value = int(raw)
    return value if value <= MAX_SEQ else None


def _fingerprint(message: dict[str, Any]) -> bytes:
    try:
        return jsonrpc.dumps(message)
    except TypeError:  # not encodable: never equal to another entry
        return b"%d" % id(message)


def drop_overlap(missed: list[tuple[int, dict[str, Any]]], sub: Subscription) -> None:
    """Drop live entries the stored read already returned.

    Entries published after the subscription are queued in ``sub``; a store
    read may include the first few of them (it can see writes queued just after
    it). They are the read's tail and the queue's head: remove that overlap.
    """
    queued = list(sub.pending)
    if not queued or not missed:
        return
    key = [(pos, _fingerprint(m)) for pos, m in queued]
    tail = [(pos, _fingerprint(m)) for pos, m in missed[-len(queued) :]]
    for j in range(min(len(key), len(tail)), 0, -1):
        if tail[-j:] == key[:j]:
            for _ in range(j):
                sub.pending.popleft()
            return


async def stream_events(
    request: web.Request,
    bridge: Bridge,
    send_timeout: float,
    headers: dict[str, str],
    wire: WireEncoder = PLAIN,
    principal: str = "",
) -> web.StreamResponse:
    session_id = request.match_info.get("sessionId", "")
    after = parse_after(request.headers.get("Last-Event-ID"), request.query.get("afterSeq"))
    if after is None or not session_id:
        body = jsonrpc.error(None, jsonrpc.INVALID_PARAMS, BAD_AFTER)
        return web.Response(status=400, body=jsonrpc.dumps(body), content_type="application/json")
    try:
        await bridge.sessions.check_owner(session_id, principal)
    except jsonrpc.RpcError as exc:  # another principal's session
        body = jsonrpc.error(None, exc.code, exc.message)
        return web.Response(status=403, body=jsonrpc.dumps(body), content_type="application/json")
    follow = request.query.get("follow", "0").lower() in ("1", "true", "yes")
    sessions = bridge.sessions
    stream = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
            **headers,
        },
    )
    # subscribe and queue the ledger read with no await in between: the read sees every
    # entry recorded before the subscription, the subscription every one after
    sub = sessions.feed.subscribe(session_id) if follow else None
    try:
        limit = bridge.config.store.ledger_max_entries
        missed = await sessions.store.replay(session_id, after, limit)
        if sub is not None:
            drop_overlap(missed, sub)
        await stream.prepare(request)
        sender = OrderedSender(stream.write, timeout=send_timeout)
        for pos, message in missed:
            event = event_bytes(pos, message, wire)
            if event is not None and not await sender.send_bytes(event):
                return stream
        if sub is None:
            return stream
        deadline = time.monotonic() + FOLLOW_MAX_SECONDS
        while not sender.broken and not bridge.supervisor.closing and not sub.overflowed:
            if time.monotonic() >= deadline:
                break
            entry = await sub.next(KEEPALIVE_SECONDS)
            if entry is None:
                if not sub.overflowed:
                    await sender.send_bytes(b": keep-alive\n\n")
                continue
            event = event_bytes(*entry, wire)
            if event is not None:
                await sender.send_bytes(event)
    finally:
        if sub is not None:
            sessions.feed.unsubscribe(sub)
        if stream.prepared:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await stream.write_eof()
    return stream
