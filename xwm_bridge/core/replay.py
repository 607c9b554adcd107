"""``session.replay``: the notifications a reconnecting client missed (issue 6).

Additive to the original contract. ``{sessionId, afterSeq}`` → the ledger's
notifications sent after bridge update ``afterSeq`` (bridge ``session.update``
frames with a higher ``seq`` and upstream frames relayed after update
``afterSeq``), oldest first, plus the session's last turn and its status.
``{sessionId, afterEventId}`` selects by event id instead — the same position
as the SSE catch-up stream's ``id:`` — which counts every entry once, so it
resumes with no duplicate. Each turn's final result in the window comes back
in ``results``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge.core.params import session_id_of
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.core.usage import Usage
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.store.base import RESULT

#: the highest seq a client may name: ledger positions (2·seq + 1) stay within int64
MAX_SEQ = 2**62 - 1
AFTER_SEQ_INVALID = "afterSeq must be a non-negative integer"
AFTER_SEQ_TOO_LARGE = f"afterSeq and afterEventId must be at most {MAX_SEQ}"
AFTER_EVENT_INVALID = "afterEventId must be a non-negative integer"
LIMIT_INVALID = "limit must be a positive integer"


def _int_param(params: dict[str, Any], key: str, default: int, message: str, low: int) -> int:
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RpcError(INVALID_PARAMS, message)
    return value


@dataclass(frozen=True, slots=True)
class ReplayParams:
    session_id: str
    after_seq: int
    limit: int
    #: ``afterEventId``: when given, it selects instead of ``afterSeq``
    after_event: int | None = None

    @classmethod
    def parse(cls, params: dict[str, Any], max_items: int) -> ReplayParams:
        session_id = session_id_of(params)
        after = _int_param(params, "afterSeq", 0, AFTER_SEQ_INVALID, 0)
        after_event: int | None = None
        if params.get("afterEventId") is not None:
            after_event = _int_param(params, "afterEventId", 0, AFTER_EVENT_INVALID, 0)
        if after > MAX_SEQ or (after_event or 0) > MAX_SEQ:
            raise RpcError(INVALID_PARAMS, AFTER_SEQ_TOO_LARGE)
        limit = _int_param(params, "limit", max_items, LIMIT_INVALID, 1)  # then capped
        return cls(session_id, after, min(limit, max_items), after_event)


async def replay(sessions: SessionRegistry, rp: ReplayParams) -> dict[str, Any]:
    live = sessions.get(rp.session_id)
    record = None if live is not None else await sessions.store.load(rp.session_id)
    entries = await sessions.store.replay(
        rp.session_id, rp.after_seq, rp.limit + 1, after_event=rp.after_event
    )
    more = len(entries) > rp.limit
    upstream: dict[str, str] = {}
    if live is not None:
        seq, events, turn_id, status = (
            live.seq,
            live.events,
            live.last_turn_id,
            live.last_turn_status,
        )
        upstream = live.upstream
    elif record is not None:
        seq, events, turn_id, status = (
            record.seq,
            record.events,
            record.last_turn_id,
            record.last_turn_status,
        )
        upstream = dict(record.upstream)
    else:
        seq, events, turn_id, status = 0, 0, "", ""
    totals = Usage.from_record(upstream)
    notes = [e for e in entries[: rp.limit] if e.kind != RESULT]
    results = [
        {"eventId": e.event_id, "turnId": e.turn_id, "result": e.message}
        for e in entries[: rp.limit]
        if e.kind == RESULT
    ]
    out: dict[str, Any] = {
        "sessionId": rp.session_id,
        "found": live is not None or record is not None,
        "afterSeq": rp.after_seq,
        "lastSeq": seq,
        "lastEventId": events,
        "lastTurnId": turn_id,
        "lastTurnStatus": status,
        "notifications": [e.message for e in notes],
        "eventIds": [e.event_id for e in notes],
        "results": results,
        "truncated": more,
    }
    if rp.after_event is not None:
        out["afterEventId"] = rp.after_event
    if totals.turns:
        out["usage"] = {**totals.wire(), "turns": totals.turns}
    return out
