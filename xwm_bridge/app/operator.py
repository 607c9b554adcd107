"""Operator methods (issue 13): ``session.list``, ``session.get``, ``permission.list``,
``bridge.watch``, ``bridge.health`` and ``bridge.config``, on every transport.

They sit behind the same bearer check as every other method. Which sessions a
caller may see is decided in one place, :meth:`OperatorMethods.sees_all_sessions`
(issue 16): a token in ``admin_tokens`` sees every session; so does every caller
when clients do not authenticate, or share one token (``auth_token`` alone). With
several ``client_tokens``, any other caller sees only its own sessions in
``session.list``/``session.get``/``permission.list`` and is refused the
bridge-wide feeds (``bridge.watch``, ``bridge.health``, ``bridge.config``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.config_view import masked
from xwm_bridge.core.context import CallContext, Handler, Notify
from xwm_bridge.core.params import session_id_of
from xwm_bridge.core.watch import (
    KINDS,
    WatchEvent,
    WatchFilter,
    WatchSubscription,
    format_cursor,
    parse_cursor,
)
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.store.base import SessionRecord
from xwm_bridge.store.records import (
    SESSION_STATES,
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionQuery,
    TurnRecord,
    decode_page_cursor,
    encode_page_cursor,
)

if TYPE_CHECKING:
    from xwm_bridge.app.bridge import Bridge

#: the notification method of ``bridge.watch``
EVENT_METHOD = "bridge.event"
OPERATOR_ONLY = "this method needs an admin token (admin_tokens): it shows every session"
OPERATOR_METHODS = (
    "session.list",
    "session.get",
    "permission.list",
    "bridge.watch",
    "bridge.health",
    "bridge.config",
)
MAX_PAGE = 200
DEFAULT_PAGE = 50
#: plain-JSON HTTP long-poll: default and longest wait
DEFAULT_WAIT_MS = 25_000
MAX_WAIT_MS = 60_000
MAX_BATCH = 1000
#: a streaming watch ends after this long (the watcher re-watches with its cursor);
#: also the longest one may ask for (``maxSeconds`` above it is clamped): a watch holds
#: a subscription, and a bound it reaches makes every watcher re-watch now and then
DEFAULT_WATCH_SECONDS = 3600.0
MAX_WATCH_SECONDS = DEFAULT_WATCH_SECONDS
#: how often a streaming watch checks for shutdown and a closed connection
WAKE_S = 1.0
#: ``session.get`` reads the record and turns again (``session.list`` its page) while a
#: turn starts or ends meanwhile, at most this many times in all (then it answers with
#: its last read)
GET_READS = 3


def _of(running: frozenset[tuple[str, str]], sessions: set[str]) -> frozenset[tuple[str, str]]:
    """The running turns of ``sessions`` only."""
    return frozenset(key for key in running if key[0] in sessions)


def _text_param(params: dict[str, Any], key: str) -> str:
    value = params.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, f"{key} must be a string")
    return value.strip()


def _number_param(params: dict[str, Any], key: str, default: float, low: float) -> float:
    """A finite number ≥ ``low`` (a caller clamps it from above), else -32602: NaN
    passed ``< low`` (a watch that never timed out), inf broke ``int()``."""
    value = params.get(key, default)
    if value is None:
        return default
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):  # an int past a float's range
            number = float(value)
    if not math.isfinite(number) or number < low:
        raise RpcError(INVALID_PARAMS, f"{key} must be a number ≥ {low:g}")
    return number


def _bool_param(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise RpcError(INVALID_PARAMS, f"{key} must be true or false")
    return value


def parse_session_query(params: dict[str, Any]) -> SessionQuery:
    state = _text_param(params, "state").lower()
    if state and state not in SESSION_STATES:
        raise RpcError(INVALID_PARAMS, f"state must be one of {', '.join(SESSION_STATES)}")
    cursor = _text_param(params, "cursor")
    after = decode_page_cursor(cursor) if cursor else None
    if cursor and after is None:
        raise RpcError(INVALID_PARAMS, "cursor is not one this bridge returned")
    limit = int(_number_param(params, "limit", DEFAULT_PAGE, 1))
    return SessionQuery(
        state=state,
        provider=_text_param(params, "provider"),
        thread_id=_text_param(params, "threadId"),
        updated_since=_number_param(params, "updatedSince", 0.0, 0.0),
        after=after,
        limit=min(limit, MAX_PAGE),
    )


@dataclass(frozen=True, slots=True)
class WatchParams:
    since: str | None
    filter: WatchFilter
    wait_s: float
    max_events: int
    max_seconds: float

    @classmethod
    def parse(cls, params: dict[str, Any]) -> WatchParams:
        since = _text_param(params, "since") or None
        if since is not None and parse_cursor(since) is None:
            raise RpcError(INVALID_PARAMS, "since must be a cursor this bridge returned")
        kinds = params.get("kinds")
        if kinds is None:
            wanted: frozenset[str] = frozenset()
        elif isinstance(kinds, list) and all(isinstance(k, str) and k in KINDS for k in kinds):
            wanted = frozenset(kinds)
        else:
            raise RpcError(INVALID_PARAMS, f"kinds must be a list of: {', '.join(KINDS)}")
        wait_ms = _number_param(params, "waitMs", DEFAULT_WAIT_MS, 0)
        return cls(
            since=since,
            filter=WatchFilter(wanted, _text_param(params, "sessionId")),
            wait_s=min(wait_ms, MAX_WAIT_MS) / 1000,
            max_events=min(int(_number_param(params, "maxEvents", MAX_BATCH, 1)), MAX_BATCH),
            max_seconds=min(
                _number_param(params, "maxSeconds", DEFAULT_WATCH_SECONDS, 0.1), MAX_WATCH_SECONDS
            ),
        )


class OperatorMethods:
    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge

    def table(self) -> dict[str, Handler]:
        return {
            "session.list": self.session_list,
            "session.get": self.session_get,
            "permission.list": self.permission_list,
            "bridge.watch": self.bridge_watch,
            "bridge.health": self.bridge_health,
            "bridge.config": self.bridge_config,
        }

    # --- who sees what ---------------------------------------------------------------------

    def sees_all_sessions(self, call: CallContext) -> bool:
        """THE hook for session visibility (see the module docstring)."""
        return self._bridge.sessions.sees_all(call.principal)

    def _check_visible(self, call: CallContext) -> None:
        """The bridge-wide feeds: only for callers that see every session."""
        if not self.sees_all_sessions(call):
            raise RpcError(jsonrpc.FORBIDDEN, OPERATOR_ONLY)

    # --- sessions --------------------------------------------------------------------------

    def _running_turn(self, record: SessionRecord) -> TurnRecord | None:
        journal = self._bridge.runner.journal
        if journal is None:
            return None
        return next(
            (t for t in journal.running(record.session_id) if t.turn_id == record.last_turn_id),
            None,
        )

    def _session_row(self, record: SessionRecord, turn: TurnRecord | None) -> dict[str, Any]:
        sessions = self._bridge.sessions
        running = sessions.running(record.session_id) is not None
        live = sessions.get(record.session_id)
        status = live.last_turn_status if live is not None else record.last_turn_status
        return {
            "sessionId": record.session_id,
            "threadId": record.thread_id,
            "provider": record.provider,
            "state": "running" if running else (status or "idle"),
            "running": running,
            "queued": sessions.queued(record.session_id),
            "seq": live.seq if live is not None else record.seq,
            "turnCount": len(record.history),
            "updatedAt": record.updated_at,
            "lastTurnId": record.last_turn_id,
            "lastTurn": turn.wire(with_result=False) if turn is not None else None,
        }

    async def session_list(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        query = parse_session_query(params)
        if not self.sees_all_sessions(call):  # its own sessions only
            query = dataclasses.replace(query, owner=call.principal)
        for _ in range(GET_READS):
            cursor = self._bridge.events.cursor  # watch from here: nothing after it is lost
            before = self._all_running()
            page = await self._bridge.store.list_sessions(query)
            listed = {record.session_id for record, _ in page.items}
            if _of(self._all_running(), listed) == _of(before, listed):
                break  # no turn of a listed session started or ended during the read
            # else a row's running state (read next, from memory) would not match its
            # stored record and last turn: read the page again, a bounded number of times
        return {
            "sessions": [self._session_row(r, t or self._running_turn(r)) for r, t in page.items],
            "nextCursor": encode_page_cursor(page.next_after) if page.next_after else None,
            "watchCursor": cursor,
        }

    async def session_get(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = session_id_of(params)
        await self._bridge.sessions.check_owner(session_id, call.principal)
        limit = int(_number_param(params, "turns", TURNS_PER_SESSION, 1))
        for _ in range(GET_READS):
            cursor = self._bridge.events.cursor
            before = _of(self._all_running(), {session_id})
            record, turns = await self._read_session(session_id, limit)
            if _of(self._all_running(), {session_id}) == before:
                break  # no turn started or ended during the reads: one consistent view
            # else a turn ended after the store's turns were read (it is in neither) or
            # started after the record was: read again, a bounded number of times
        turns = self._with_running(session_id, turns, limit)
        last = next((t for t in reversed(turns) if t.turn_id == record.last_turn_id), None)
        row = self._session_row(record, last)  # the running state of the same moment
        pending = await self._pending(session_id)
        return {
            "session": row,
            "history": list(record.history),
            "turns": [t.wire() for t in turns],
            "permissions": [p.wire() for p in pending],
            "watchCursor": cursor,
        }

    def _all_running(self) -> frozenset[tuple[str, str]]:
        journal = self._bridge.runner.journal
        return frozenset() if journal is None else journal.running_keys()

    async def _read_session(
        self, session_id: str, limit: int
    ) -> tuple[SessionRecord, list[TurnRecord]]:
        store = self._bridge.store
        record = await store.load(session_id)
        live = self._bridge.sessions.get(session_id)
        if record is None and live is not None:
            record = live.snapshot()
        if record is None:
            raise RpcError(INVALID_PARAMS, f"no session with sessionId {session_id}")
        return record, await store.turns(session_id, limit)

    def _with_running(
        self, session_id: str, turns: list[TurnRecord], limit: int
    ) -> list[TurnRecord]:
        """The stored turns and the running one(s), in memory until they end."""
        journal = self._bridge.runner.journal
        if journal is None:
            return turns
        stored = {t.turn_id for t in turns}
        turns = turns + [t for t in journal.running(session_id) if t.turn_id not in stored]
        return turns[-limit:]

    # --- permissions -----------------------------------------------------------------------

    async def _pending(self, session_id: str = "") -> list[PermissionRecord]:
        """Pending requests of every replica (the store), this one's own first-hand."""
        broker = self._bridge.permissions
        local = {r.key: r for r in broker.snapshot(session_id=session_id)}
        stored = await self._bridge.store.permissions()
        merged = dict(local)
        for r in stored:
            if r.key not in merged and (not session_id or r.session_id == session_id):
                merged[r.key] = r
        return sorted(merged.values(), key=lambda r: (r.created_at, r.request_id))

    async def permission_list(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        session_id = _text_param(params, "sessionId")
        include = _bool_param(params, "includeResolved")
        cursor = self._bridge.events.cursor
        requests = await self._pending(session_id)
        if include:
            resolved = self._bridge.permissions.snapshot(include_resolved=True)
            requests += [
                r
                for r in resolved
                if r.state == "resolved" and (not session_id or r.session_id == session_id)
            ]
        if not self.sees_all_sessions(call):  # the requests of its own turns only
            requests = [r for r in requests if await self._owns(r, call)]
        return {"requests": [r.wire() for r in requests], "watchCursor": cursor}

    async def _owns(self, record: PermissionRecord, call: CallContext) -> bool:
        """Raised by the caller's turn; a record of an earlier version names no principal:
        then by its session's owner (a session that is gone names none)."""
        if record.principal:
            return record.principal == call.principal
        try:
            await self._bridge.sessions.check_owner(record.session_id, call.principal)
        except RpcError:
            return False
        return True

    # --- the live feed ---------------------------------------------------------------------

    def _note(self, event: WatchEvent) -> dict[str, Any]:
        return jsonrpc.notification(EVENT_METHOD, event.wire(self._bridge.events.epoch))

    async def bridge_watch(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        self._check_visible(call)
        wp = WatchParams.parse(params)
        log = self._bridge.events
        # subscribe and read the backlog with no await between: nothing falls in a gap
        sub = log.subscribe(wp.filter)
        try:
            catch = log.catchup(wp.since, wp.filter)
            if call.notify is None:
                return await self._long_poll(wp, catch.events, catch.reset, catch.head, sub)
            notify = call.notify
            last = catch.head
            for event in catch.events:
                await notify(self._note(event))
            await notify(
                jsonrpc.notification(
                    EVENT_METHOD,
                    {
                        "kind": "watch",
                        "type": "live",
                        "cursor": _cursor(log.epoch, last),
                        "reset": catch.reset,
                        "replayed": len(catch.events),
                    },
                )
            )
            reason, last = await self._stream(wp, call, sub, notify, last)
            return {"cursor": _cursor(log.epoch, last), "reason": reason, "reset": catch.reset}
        finally:
            log.unsubscribe(sub)

    async def _stream(
        self,
        wp: WatchParams,
        call: CallContext,
        sub: WatchSubscription,
        notify: Notify,
        last: int,
    ) -> tuple[str, int]:
        """Send events as they come until the watch ends; (why, last seq sent). On
        shutdown it goes on while the drain lets running turns finish, so the watcher
        sees how they end, and ends once none runs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wp.max_seconds
        bridge = self._bridge
        while True:
            if bridge.supervisor.closing and not bridge.sessions.running_count():
                while sub.pending and not sub.overflowed:  # what the last turns published
                    for event in sub.drain(MAX_BATCH):
                        await notify(self._note(event))
                        last = event.seq
                return "shutdown", last
            if call.connection is not None and call.connection.closed:
                return "disconnected", last
            if sub.overflowed:
                return "overflow", last
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout", last
            await sub.wait(min(WAKE_S, remaining))
            for event in sub.drain(MAX_BATCH):
                await notify(self._note(event))
                last = event.seq

    async def _long_poll(
        self,
        wp: WatchParams,
        backlog: list[WatchEvent],
        reset: bool,
        head: int,
        sub: WatchSubscription,
    ) -> dict[str, Any]:
        log = self._bridge.events
        epoch = log.epoch
        events = backlog[: wp.max_events]
        more = len(backlog) > len(events)
        # the whole backlog: every event up to `head` it may have is in it, so the next
        # poll goes on from `head` (as the stream's `live` cursor), not from the last event
        # sent: with no `since` that is the last metric sample, and the next poll replayed
        # every event between it and the first poll, all from before the watcher came
        cursor = events[-1].seq if more else head
        if not events and not reset and wp.wait_s > 0:
            deadline = time.monotonic() + wp.wait_s
            while not sub.pending and not sub.overflowed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._bridge.supervisor.closing:
                    break
                await sub.wait(min(WAKE_S, remaining))
            events = sub.drain(wp.max_events)
            more = bool(sub.pending)
            if more:
                cursor = events[-1].seq
            elif not sub.overflowed:  # it got every event up to now that it may have
                cursor = log.head
            # overflowed: from `head` again (the log holds what it dropped, or says reset)
        return {
            "cursor": _cursor(epoch, cursor),
            "events": [e.wire(epoch) for e in events],
            "reset": reset,
            "more": more,
        }

    # --- health and config -----------------------------------------------------------------

    async def bridge_health(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        self._check_visible(call)
        log = self._bridge.events
        samples = [{"ts": e.ts, **e.data} for e in log.samples()]
        return {**self._bridge.health.snapshot(), "samples": samples, "watchCursor": log.cursor}

    async def bridge_config(
        self, params: dict[str, Any], call: CallContext, method: str
    ) -> dict[str, Any]:
        self._check_visible(call)
        sources = {k: coerce.text(v) for k, v in self._bridge.config_sources.items()}
        return {"config": masked(self._bridge.config), "sources": sources}


_cursor = format_cursor
