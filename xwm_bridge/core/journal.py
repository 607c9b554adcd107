"""The turn journal (issue 13): one :class:`TurnRecord` per turn, and ``turn`` /
``session`` events on the bridge event log.

A running turn's record is held here (:meth:`TurnJournal.running`) and saved to the
store when the turn ends: one store write per turn, not two. A turn that dies with
the process is written by the store's ``recover`` (status ``interrupted``) from the
session record, which is saved as ``running`` when the turn starts.

The turn runner calls :meth:`started` and :meth:`finished`; the session
registry publishes each streamed update itself (``SessionRegistry.events``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
    """Turn records as the operator views see them (running ones from memory)."""

    def __init__(self, store: SessionStore, events: EventLog) -> None:
        self._store = store
        self._events = events
        #: (session id, turn id) → the record of a turn that is running now
        self._running: dict[tuple[str, str], TurnRecord] = {}
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
        self._running[(record.session_id, turn_id)] = record
        if self._events.recording:
            self._events.publish(
                "turn", "started", record.wire(with_result=False), session.session_id
            )
        return record

    def running_keys(self) -> frozenset[tuple[str, str]]:
        """(session id, turn id) of every turn running now: compared before and after
        a read, it tells whether a turn started or ended meanwhile."""
        return frozenset(self._running)

    def running(self, session_id: str) -> list[TurnRecord]:
        """The session's running turn(s) in this process (at most one per thread)."""
        return [r for (sid, _), r in self._running.items() if sid == session_id]

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
        self._running.pop((record.session_id, record.turn_id), None)
        error = ""
        if isinstance(result, dict) and result.get("success") is False:
            error = coerce.text(result.get("error"))[:2000]
        done = TurnRecord(  # not dataclasses.replace: it re-validates every field
            session_id=record.session_id,
            turn_id=record.turn_id,
            thread_id=record.thread_id,
            method=record.method,
            mode=record.mode,
            target=record.target,
            provider=record.provider,
            model=record.model,
            prompt=record.prompt,
            status=status,
            started_at=record.started_at,
            finished_at=time.time(),
            usage=usage_of(result),
            error=error,
            result=bound_result(result),
        )
        if store:
            self._store.save_turn(done)
        if self._events.recording:
            self._events.publish(
                "turn",
                "finished",
                {**done.wire(with_result=False), "session": session_fields(session)},
                session.session_id,
            )
        for observer in self.observers:
            observer(done)
        return done
