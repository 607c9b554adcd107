"""The turn journal (issue 13): one :class:`TurnRecord` per turn, saved to the store at
its start and its end, and ``turn`` / ``session`` events on the bridge event log.

The turn runner calls :meth:`started` and :meth:`finished`; the session
registry publishes each streamed update itself (``SessionRegistry.events``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.sessions import Session
from xwm_bridge.core.turn import TurnRequest
from xwm_bridge.core.watch import EventLog
from xwm_bridge.store.base import SessionStore
from xwm_bridge.store.records import MAX_PROMPT_CHARS, TurnRecord, bound_result


def usage_of(result: dict[str, Any] | None) -> dict[str, Any] | None:
    usage = result.get("usage") if isinstance(result, dict) else None
    return usage if isinstance(usage, dict) else None


def session_fields(session: Session) -> dict[str, Any]:
    return {
        "threadId": session.thread_id,
        "provider": session.provider,
        "lastTurnId": session.last_turn_id,
        "lastTurnStatus": session.last_turn_status,
    }


class TurnJournal:
    def __init__(self, store: SessionStore, events: EventLog) -> None:
        self._store = store
        self._events = events
        #: told of every finished turn (the health view's provider outcomes)
        self.observers: list[Callable[[TurnRecord], None]] = []

    def started(self, turn: TurnRequest, session: Session, turn_id: str) -> TurnRecord:
        record = TurnRecord(
            session_id=session.session_id,
            turn_id=turn_id,
            thread_id=session.thread_id,
            method=turn.method,
            mode=turn.mode.value,
            target=turn.decision.execution_target,
            provider=turn.provider,
            model=turn.decision.model or coerce.text(turn.upstream.get("model")),
            prompt=turn.prompt[:MAX_PROMPT_CHARS],
            started_at=time.time(),
        )
        self._store.save_turn(record)
        self._events.publish("turn", "started", record.wire(with_result=False), session.session_id)
        return record

    def finished(
        self,
        record: TurnRecord,
        session: Session,
        status: str,
        result: dict[str, Any] | None,
        *,
        store: bool = True,
    ) -> TurnRecord:
        """``store=False``: the session was reset meanwhile; only the event is published."""
        error = ""
        if isinstance(result, dict) and result.get("success") is False:
            error = coerce.text(result.get("error"))[:2000]
        done = replace(
            record,
            status=status,
            finished_at=time.time(),
            usage=usage_of(result),
            error=error,
            result=bound_result(result),
        )
        if store:
            self._store.save_turn(done)
        self._events.publish(
            "turn",
            "finished",
            {**done.wire(with_result=False), "session": session_fields(session)},
            session.session_id,
        )
        for observer in self.observers:
            observer(done)
        return done
