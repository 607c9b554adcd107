"""Session records and running-turn handles (contract.md §12.1), reaped when idle.

The registry is the live, in-memory view; every change that must survive a
restart is also queued to a :class:`~xwm_bridge.store.base.SessionStore`
(non-blocking), and a session not in memory is loaded back from it.

A running turn is tracked by session id separately from the record, so a
``session.start`` that resets the record while an older turn still runs does
not lose that turn's cancel handle (weakness 3 of the original).

A ``session.close`` that cancels a running turn keeps the session id reserved
(:class:`Closing`) until that turn has ended: a turn for the id on another thread
waits for it (:meth:`SessionRegistry.until_closed`), so two turns of one id never
run at once and the closed turn's unwinding (its upstream cancel, its permission
requests) does not meet the new session's turn.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.core.feed import SessionFeed
from xwm_bridge.core.handles import Closing, TurnHandle
from xwm_bridge.core.watch import EventLog
from xwm_bridge.jsonrpc import FORBIDDEN, QUEUE_FULL, RpcError
from xwm_bridge.store.base import (
    RESULT,
    LedgerEntry,
    SessionRecord,
    SessionStore,
    emitted_pos,
    relayed_pos,
)
from xwm_bridge.store.memory import MemoryStore
from xwm_bridge.tasks import wait_for

MAX_HISTORY = 64
#: Session.history_id: one per Session object made in this process
_HISTORY_IDS = itertools.count(1)
SESSION_FORBIDDEN = "session belongs to another client"
SESSION_CLOSING = "session is closing: its last turn is still ending; retry when it has ended"
#: default of ``limits.session_close_wait``
CLOSE_WAIT = 10.0
#: default of ``store.history_max_bytes``
HISTORY_MAX_BYTES = 1024 * 1024


@dataclass(slots=True)
class Session:
    session_id: str
    thread_id: str
    provider: str = ""
    history: list[str] = field(default_factory=list)
    seq: int = 0
    #: event id of the last ledger entry (every notification and result counts)
    events: int = 0
    last_used: float = field(default_factory=time.monotonic)
    last_turn_id: str = ""
    last_turn_status: str = ""
    #: upstream session ids (``acpSessionId``, ``acpCwd``, ``gatewaySessionKey``…)
    upstream: dict[str, str] = field(default_factory=dict)
    #: prompt history cap in UTF-8 bytes (``store.history_max_bytes``)
    history_max_bytes: int = HISTORY_MAX_BYTES
    #: the principal that created it ("" = unowned: the first turn claims it)
    owner: str = ""
    #: prompts added in all (the history holds the newest); see SessionRecord.prompts
    prompts: int = 0
    #: this object's identity for the store (SessionRecord.history_id)
    history_id: int = field(default_factory=lambda: next(_HISTORY_IDS))
    #: ``sum(map(len, history))``, kept by :meth:`add_prompt` (not summed over up to
    #: MAX_HISTORY prompts every turn); valid while ``history`` is the list it counted,
    #: at the length it left it (else counted again: the list was replaced or changed)
    _chars: int = field(default=0, init=False, repr=False, compare=False)
    _counted: list[str] | None = field(default=None, init=False, repr=False, compare=False)
    _counted_len: int = field(default=0, init=False, repr=False, compare=False)

    def snapshot(self) -> SessionRecord:
        return SessionRecord(
            session_id=self.session_id,
            thread_id=self.thread_id,
            provider=self.provider,
            history=tuple(self.history),
            seq=self.seq,
            last_turn_id=self.last_turn_id,
            last_turn_status=self.last_turn_status,
            upstream=tuple(self.upstream.items()),
            owner=self.owner,
            events=self.events,
            prompts=self.prompts,
            history_id=self.history_id,
        )

    @classmethod
    def restore(cls, record: SessionRecord) -> Session:
        return cls(
            record.session_id,
            record.thread_id,
            provider=record.provider,
            history=list(record.history),
            seq=record.seq,
            last_turn_id=record.last_turn_id,
            last_turn_status=record.last_turn_status,
            upstream=dict(record.upstream),
            owner=record.owner,
            events=record.events,
            prompts=max(record.prompts, len(record.history)),
        )

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def next_event(self) -> int:
        self.events += 1
        return self.events

    def add_prompt(self, prompt: str) -> None:
        """Keep the prompt: at most MAX_HISTORY, and the newest that fit in
        ``history_max_bytes`` (the latest one always stays)."""
        if not prompt:
            return
        history = self.history
        if self._counted is not history or self._counted_len != len(history):
            self._chars = sum(map(len, history))
        chars = self._chars + len(prompt)
        history.append(prompt)
        self.prompts += 1
        over = len(history) - MAX_HISTORY
        if over > 0:
            chars -= sum(map(len, history[:over]))
            del history[:over]
        cap = self.history_max_bytes
        if chars * 4 > cap:  # a UTF-8 char is at most 4 bytes
            sizes = [len(p.encode()) for p in history]
            total, drop = sum(sizes), 0
            while total > cap and drop < len(sizes) - 1:
                total -= sizes[drop]
                drop += 1
            if drop:
                chars -= sum(map(len, history[:drop]))
                del history[:drop]
        self._chars, self._counted, self._counted_len = chars, history, len(history)


class SessionRegistry:
    def __init__(
        self,
        store: SessionStore | None = None,
        *,
        shared: bool = False,
        history_max_bytes: int = HISTORY_MAX_BYTES,
    ) -> None:
        self.store: SessionStore = store if store is not None else MemoryStore()
        self.history_max_bytes = history_max_bytes
        #: refuse a session to principals other than its owner (on when clients
        #: authenticate: without a token any bearer is accepted, so it names nobody)
        self.enforce_owner = False
        #: principals that may use every session (``admin_tokens``)
        self.admins: frozenset[str] = frozenset()
        #: one shared token and no admin token: its holder is the operator of everything
        self.single_principal = False
        #: other replicas write the same store: reload the record at turn start unless
        #: ``must_reload(thread_id)`` says this replica ran the thread's previous turn
        self.shared = shared
        self.must_reload: Callable[[str], bool] = lambda thread_id: True
        self.feed = SessionFeed()
        #: the bridge-wide event log of ``bridge.watch`` (issue 13); None = not published
        self.events: EventLog | None = None
        self._sessions: dict[str, Session] = {}
        #: session id → its running turns, oldest first: the queue key is ``threadId``, so
        #: one session may run a turn on each of several threads at once
        self._running: dict[str, list[TurnHandle]] = {}
        self._running_turns = 0
        self._pending: dict[str, int] = {}
        #: session id → the closed session's turn still ending (see :class:`Closing`)
        self._closing: dict[str, Closing] = {}
        #: ``limits.session_close_wait``: how long a turn waits for a :class:`Closing`
        self.close_wait = CLOSE_WAIT

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def reset(self, session_id: str, thread_id: str) -> Session:
        session = self._sessions[session_id] = self._new(Session(session_id, thread_id))
        self.store.delete(session_id)  # a new conversation: old record and ledger go
        if self.events is not None:
            self.events.publish("session", "started", {"threadId": thread_id}, session_id)
        return session

    def _new(self, session: Session) -> Session:
        session.history_max_bytes = self.history_max_bytes
        return session

    async def load(self, session_id: str, thread_id: str) -> Session:
        """The live session, else the one persisted by an earlier process, else a new one."""
        if session_id not in self._sessions or (self.shared and self.must_reload(thread_id)):
            record = await self.store.load(session_id)
            live = self._sessions.get(session_id)
            if record is not None and live is None:
                self._sessions[session_id] = self._new(Session.restore(record))
            elif record is not None and live is not None and self.shared:
                # another replica may have run the last turns: take its state, keep
                # this object (running-turn and agent-session bookkeeping refer to it)
                fresh = Session.restore(record)
                live.thread_id, live.provider, live.history = (
                    fresh.thread_id,
                    fresh.provider,
                    fresh.history,
                )
                live.prompts, live.history_id = fresh.prompts, fresh.history_id
                live.seq = max(live.seq, fresh.seq)
                live.events = max(live.events, fresh.events)
                live.last_turn_id, live.last_turn_status = (
                    fresh.last_turn_id,
                    fresh.last_turn_status,
                )
                live.upstream = fresh.upstream
                live.owner = fresh.owner or live.owner
        return self.get_or_create(session_id, thread_id)

    # --- ownership (issue 16 item 8) ------------------------------------------------------

    def sees_all(self, principal: str) -> bool:
        """May ``principal`` see and act on every session (the operator methods)?"""
        return not self.enforce_owner or self.single_principal or principal in self.admins

    def may_use(self, owner: str, principal: str) -> bool:
        return not owner or owner == principal or self.sees_all(principal)

    def check_live_owner(self, session_id: str, principal: str) -> None:
        """:meth:`check_owner` for a session held in memory only (no store read, so
        no suspension: the caller keeps its place in the thread's FIFO)."""
        live = self._sessions.get(session_id)
        if live is not None and not self.may_use(live.owner, principal):
            raise RpcError(FORBIDDEN, SESSION_FORBIDDEN)

    async def check_owner(self, session_id: str, principal: str) -> None:
        """Raise ``-32003`` unless ``principal`` may use the session (live or stored;
        an unknown session is anyone's)."""
        if self.sees_all(principal):  # no store read on the common path
            return
        live = self._sessions.get(session_id)
        if live is not None:
            owner = live.owner
        else:
            record = await self.store.load(session_id)
            owner = record.owner if record is not None else ""
        if not self.may_use(owner, principal):
            raise RpcError(FORBIDDEN, SESSION_FORBIDDEN)

    def claim(self, session: Session, principal: str) -> None:
        """Refuse a turn on another principal's session; record the owner of a new one."""
        if not self.may_use(session.owner, principal):
            raise RpcError(FORBIDDEN, SESSION_FORBIDDEN)
        if not session.owner:
            session.owner = principal

    def persist(self, session: Session) -> None:
        if self._sessions.get(session.session_id) is session:  # not replaced by a reset
            self.store.save(session.snapshot())

    def record(
        self, session: Session, turn_id: str, messages: list[dict[str, Any]], relayed: bool
    ) -> None:
        """Add notifications sent together during a turn to the session's ledger: one
        entry each (same position, consecutive event ids), one store write."""
        if self._sessions.get(session.session_id) is not session or not messages:
            return
        pos = relayed_pos(session.seq) if relayed else emitted_pos(session.seq)
        sid = session.session_id
        first = session.events + 1  # consecutive event ids, one timestamp: they came together
        session.events += len(messages)
        now = time.time()
        entries = [LedgerEntry(pos, turn_id, m, now, first + i) for i, m in enumerate(messages)]
        if len(entries) == 1:
            self.store.append(sid, entries[0])
        else:
            self.store.append_many(sid, entries)
        self.feed.publish_many(sid, entries)
        if self.events is not None and self.events.recording:
            for entry in entries:
                # eventId: the ledger entry's id (session.replay's eventIds), so a watcher
                # that also read the ledger drops what it already has
                data = {"turnId": turn_id, "relayed": relayed, "eventId": entry.event_id}
                update = entry.message.get("params")
                self.events.publish("turn", "update", {**data, "update": update}, sid)

    def record_result(self, session: Session, turn_id: str, result: dict[str, Any]) -> None:
        """Add a turn's final result to the ledger (``session.replay``, catch-up)."""
        if self._sessions.get(session.session_id) is not session:
            return
        entry = LedgerEntry(
            relayed_pos(session.seq), turn_id, result, event_id=session.next_event(), kind=RESULT
        )
        self.store.append(session.session_id, entry)
        self.feed.publish(session.session_id, entry)

    def get_or_create(self, session_id: str, thread_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = self._new(Session(session_id, thread_id))
        if thread_id:
            session.thread_id = thread_id
        session.last_used = time.monotonic()
        return session

    # queued-turn accounting keeps a session alive while its turns wait
    def turn_queued(self, session_id: str) -> None:
        self._pending[session_id] = self._pending.get(session_id, 0) + 1

    def turn_dequeued(self, session_id: str) -> None:
        left = self._pending.get(session_id, 0) - 1
        if left > 0:
            self._pending[session_id] = left
        else:
            self._pending.pop(session_id, None)
        session = self._sessions.get(session_id)
        if session is not None:
            session.last_used = time.monotonic()

    def watched(self) -> bool:
        """Someone follows the live feed (``bridge.watch``)."""
        return self.events is not None and self.events.subscribers > 0

    def queued(self, session_id: str) -> int:
        """Turns of the session waiting in a thread queue."""
        return self._pending.get(session_id, 0)

    def turn_started(self, handle: TurnHandle) -> None:
        running = self._running.get(handle.session_id)
        if running is None:
            self._running[handle.session_id] = [handle]
        else:
            running.append(handle)
        self._running_turns += 1

    def turn_finished(self, handle: TurnHandle) -> None:
        sid = handle.session_id
        running = self._running.get(sid)
        if running is not None and handle in running:
            running.remove(handle)
            self._running_turns -= 1
            if not running:
                del self._running[sid]
        closing = self._closing.get(sid)
        if closing is not None and handle in closing.handles:
            closing.handles.remove(handle)
            if not closing.handles:
                del self._closing[sid]
                closing.ended.set()  # the id is free: turns waiting for it go on

    def running(self, session_id: str) -> TurnHandle | None:
        """The session's newest running turn."""
        running = self._running.get(session_id)
        return running[-1] if running else None

    def running_count(self) -> int:
        """Running turns (a session running on two threads counts twice)."""
        return self._running_turns

    def cancel(self, session_id: str) -> bool:
        """Cancel every running turn of the session; true if one was cancelled."""
        return sum(h.cancel() for h in list(self._running.get(session_id, ()))) > 0

    def cancel_all(self) -> int:
        """Cancel every running turn (shutdown after the grace period)."""
        return sum(h.cancel() for running in list(self._running.values()) for h in running[:])

    def closing(self, session_id: str) -> Closing | None:
        """The closed session's turn still ending, if any (one dict lookup: a turn's
        start checks it)."""
        return self._closing.get(session_id)

    async def until_closed(self, session_id: str) -> None:
        """Wait until no closed session's turn of ``session_id`` is still ending; past
        ``close_wait`` seconds raise ``-32004`` (the client retries later)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.close_wait
        while (closing := self._closing.get(session_id)) is not None:
            closing.waiters += 1
            try:
                await wait_for(closing.ended.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise RpcError(QUEUE_FULL, SESSION_CLOSING) from None
            finally:
                closing.waiters -= 1

    def close(self, session_id: str) -> bool:
        existed = self._sessions.pop(session_id, None) is not None
        self.store.delete(session_id)
        running = list(self._running.get(session_id, ()))
        if self.cancel(session_id):  # the id is reserved until those turns end
            cancelled = [h for h in running if not h.finished]
            closing = self._closing.get(session_id)
            if closing is None:
                self._closing[session_id] = Closing(cancelled)
            else:  # a second close keeps the reservation
                closing.handles += [h for h in cancelled if h not in closing.handles]
        if self.events is not None:
            self.events.publish("session", "closed", {"existed": existed}, session_id)
        return existed

    async def close_any(self, session_id: str) -> bool:
        """``session.close``: :meth:`close`, and whether a record of the session existed
        here or in the store (contract.md §11.4: one the store alone holds, after a
        restart, the idle reaper or another replica's turns, is deleted all the same).
        A store that cannot answer still leaves the session closed here, then raises."""
        if session_id in self._sessions:
            return self.close(session_id)
        try:  # read before the close queues its delete (reads follow earlier writes)
            stored = await self.store.load(session_id) is not None
        finally:
            closed = self.close(session_id)
        return closed or stored

    def closed_elsewhere(self, session_id: str) -> None:
        """Another replica closed the session (one Redis): drop the copy held here (a
        later turn would have continued it, and saved it again); a turn of it running
        here is closed as by a local ``session.close``: cancelled, its later writes
        refused, and a store delete queued behind the writes it already made."""
        if session_id in self._running:
            self.close(session_id)
        else:
            self._sessions.pop(session_id, None)

    def reap(self, ttl: float, now: float | None = None) -> int:
        """Forget sessions idle for ``ttl`` seconds with nothing running or queued."""
        now = time.monotonic() if now is None else now
        stale = [
            sid
            for sid, s in self._sessions.items()
            if now - s.last_used >= ttl and sid not in self._running and sid not in self._pending
        ]
        for sid in stale:
            del self._sessions[sid]
        return len(stale)
