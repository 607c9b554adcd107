"""``GET /acp/sessions/{sessionId}/events``: the SSE catch-up stream (issue 6).

Additive to the original contract. A client that lost its stream reconnects
here with ``Last-Event-ID: <id>`` (or ``?afterEventId=<id>``; ``?afterSeq=<seq>``
selects by bridge seq instead) and receives, as ``id: <id>`` + ``data:
<notification>`` events, everything the session's ledger holds after that
event; each turn's final result is an ``event: result`` whose data is
``{"turnId", "result"}``. The id is the entry's event id: distinct and
increasing per session (every notification, relayed ones included, and every
result counts), so a reconnect resumes exactly after the last event seen.
With ``?follow=1`` the stream then stays open and carries the session's new
entries live, with ``: keep-alive`` comments every ``limits.sse_keepalive``,
until the client leaves, falls too far behind, the bridge shuts down (after
its drain: the entries of turns that finish in it are sent first),
``FOLLOW_MAX_SECONDS`` pass, or the session turns out to be another principal's
(one unknown when the stream opened, then created with another client token).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from aiohttp import web

from xwm_bridge import jsonrpc
from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.dispatcher import STORE_UNAVAILABLE
from xwm_bridge.core.feed import Subscription
from xwm_bridge.store.base import RESULT, LedgerEntry, StoreUnavailable
from xwm_bridge.transport.exchange import SSE_KEEPALIVE, sse_headers
from xwm_bridge.transport.notify import OrderedSender
from xwm_bridge.wire import PLAIN, WireEncoder

log = logging.getLogger("xwm_bridge.http")

FOLLOW_MAX_SECONDS = 3600.0
#: the largest afterSeq / event id a client may name: ledger positions (2·seq + 1)
#: and event ids stay within SQLite's int64
MAX_SEQ = 2**62 - 1
BAD_AFTER = "afterSeq / afterEventId / Last-Event-ID must be a non-negative integer"


def event_bytes(entry: LedgerEntry, wire: WireEncoder = PLAIN) -> bytes | None:
    """One SSE event: ``id:`` is the entry's event id; a result is ``event: result``
    (None when the message cannot be encoded; secrets are redacted)."""
    if entry.kind == RESULT:
        data = wire.encode({"turnId": entry.turn_id, "result": entry.message})
        if data is None:
            return None
        return b"event: result\nid: %d\ndata: " % entry.event_id + data + b"\n\n"
    data = wire.encode(entry.message)
    if data is None:
        return None
    return b"id: %d\ndata: " % entry.event_id + data + b"\n\n"


def _number(raw: str) -> int | None:
    """ASCII digits up to MAX_SEQ (``str.isdigit`` alone also accepts "²" and "٣",
    which ``int()`` refuses or reads; a longer number overflowed the store's integer)."""
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        return None
    value = int(raw)
    return value if value <= MAX_SEQ else None


def parse_after(
    header: str | None, after_event: str | None, after_seq: str | None
) -> tuple[int, int | None] | None:
    """``(after_seq, after_event)`` of a catch-up request; None when malformed.

    ``Last-Event-ID`` (what an ``EventSource`` sends on reconnect) wins over
    ``?afterEventId``, which wins over ``?afterSeq`` (default 0)."""
    event_raw = header if header is not None else after_event
    if event_raw is not None:
        event = _number(event_raw)
        return None if event is None else (0, event)
    seq = _number(after_seq or "0")
    return None if seq is None else (seq, None)


def drop_overlap(missed: list[LedgerEntry], sub: Subscription) -> None:
    """Drop live entries the stored read already returned.

    Entries published after the subscription are queued in ``sub``; a store
    read may include the first few of them (it can see writes queued just after
    it). Event ids are distinct and increasing: drop every queued one not after
    the last one read.
    """
    if not missed:
        return
    last = missed[-1].event_id
    while sub.pending and sub.pending[0].event_id <= last:
        sub.pending.popleft()


def _refusal(status: int, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
    """A refused catch-up, with the route's CORS headers (a browser client reads why)."""
    return web.Response(
        status=status, body=jsonrpc.dumps(body), content_type="application/json", headers=headers
    )


def _unavailable(exc: StoreUnavailable, headers: dict[str, str]) -> web.Response:
    """The store could not answer: 503, said so (the log line has why; no traceback)."""
    log.warning(STORE_UNAVAILABLE, extra={"route": "catch-up", "error": str(exc)})
    body = jsonrpc.error(None, jsonrpc.INTERNAL_ERROR, STORE_UNAVAILABLE)
    return _refusal(503, body, headers)


async def stream_events(
    request: web.Request,
    bridge: Bridge,
    send_timeout: float,
    headers: dict[str, str],
    wire: WireEncoder = PLAIN,
    principal: str = "",
) -> web.StreamResponse:
    session_id = request.match_info.get("sessionId", "")
    after = parse_after(
        request.headers.get("Last-Event-ID"),
        request.query.get("afterEventId"),
        request.query.get("afterSeq"),
    )
    if after is None or not session_id:
        body = jsonrpc.error(None, jsonrpc.INVALID_PARAMS, BAD_AFTER)
        return _refusal(400, body, headers)
    try:
        await bridge.sessions.check_owner(session_id, principal)
    except jsonrpc.RpcError as exc:  # another principal's session
        body = jsonrpc.error(None, exc.code, exc.message)
        return _refusal(403, body, headers)
    except StoreUnavailable as exc:
        return _unavailable(exc, headers)
    follow = request.query.get("follow", "0").lower() in ("1", "true", "yes")
    sessions = bridge.sessions
    stream = web.StreamResponse(
        status=200,
        headers={**sse_headers(request.keep_alive), **headers},
    )
    # subscribe and queue the ledger read with no await in between: the read sees every
    # entry recorded before the subscription, the subscription every one after
    sub = sessions.feed.subscribe(session_id) if follow else None
    try:
        limit = bridge.config.store.ledger_max_entries
        after_seq, after_event = after
        try:
            missed = await sessions.store.replay(
                session_id, after_seq, limit, after_event=after_event
            )
        except StoreUnavailable as exc:
            return _unavailable(exc, headers)
        if sub is not None:
            drop_overlap(missed, sub)
        await stream.prepare(request)
        sender = OrderedSender(stream.write, timeout=send_timeout)
        for entry in missed:
            event = event_bytes(entry, wire)
            if event is not None and not await sender.send_bytes(event):
                return stream
        if sub is None:
            return stream
        deadline = time.monotonic() + FOLLOW_MAX_SECONDS
        keepalive = bridge.config.limits.sse_keepalive or FOLLOW_MAX_SECONDS
        # on shutdown the drain's entries still come (running turns finish), then the
        # feed ends every subscription (``SessionFeed.end_all``, after the drain)
        while not sender.broken and not sub.overflowed:
            if time.monotonic() >= deadline:
                break
            live = await sub.next(keepalive)
            if live is None:
                if sub.ended:  # shutting down, after the drain: nothing more comes
                    break
                if not sub.overflowed:
                    await sender.send_bytes(SSE_KEEPALIVE)
                continue
            try:  # a session unknown at the start is anyone's, until another creates it
                sessions.check_live_owner(session_id, principal)
            except jsonrpc.RpcError:
                break
            event = event_bytes(live, wire)
            if event is not None:
                await sender.send_bytes(event)
    finally:
        if sub is not None:
            sessions.feed.unsubscribe(sub)
        if stream.prepared:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await stream.write_eof()
    return stream
