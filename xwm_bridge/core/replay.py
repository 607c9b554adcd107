"""``session.replay``: the notifications a reconnecting client missed (issue 6).

Additive to the original contract. ``{sessionId, afterSeq}`` → the ledger's
notifications sent after bridge update ``afterSeq`` (bridge ``session.update``
frames with a higher ``seq`` and upstream frames relayed after update
``afterSeq``), oldest first, plus the session's last turn and its status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge.core.params import session_id_of
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

#: the highest seq a client may name: ledger positions (2·seq + 1) stay within int64
MAX_SEQ = 2**62 - 1
AFTER_SEQ_INVALID = "afterSeq must be a non-negative integer"
AFTER_SEQ_TOO_LARGE = f"afterSeq must be at most {MAX_SEQ}"
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

    @classmethod
    def parse(cls, params: dict[str, Any], max_items: int) -> ReplayParams:
        session_id = session_id_of(params)
        after = _int_param(params, "afterSeq", 0, AFTER_SEQ_INVALID, 0)
        if after > MAX_SEQ:
            raise RpcError(INVALID_PARAMS, AFTER_SEQ_TOO_LARGE)
        limit = _int_param(params, "limit", max_items, LIMIT_INVALID, 1)  # then capped
        return cls(session_id, after, min(limit, max_items))


async def replay(sessions: SessionRegistry, rp: ReplayParams) -> dict[str, Any]:
    live = sessions.get(rp.session_id)
    record = None if live is not None else await sessions.store.load(rp.session_id)
    notes = await sessions.store.replay(rp.session_id, rp.after_seq, rp.limit + 1)
    more = len(notes) > rp.limit
    if live is not None:
        seq, turn_id, status = live.seq, live.last_turn_id, live.last_turn_status
    elif record is not None:
        seq, turn_id, status = record.seq, record.last_turn_id, record.last_turn_status
    else:
        seq, turn_id, status = 0, "", ""
    return {
        "sessionId": rp.session_id,
        "found": live is not None or record is not None,
        "afterSeq": rp.after_seq,
        "lastSeq": seq,
        "lastTurnId": turn_id,
        "lastTurnStatus": status,
        "notifications": [message for _, message in notes[: rp.limit]],
        "truncated": more,
    }
