"""Permission brokering between a stdio agent, the policy, and every client.

``session/request_permission`` → policy decision (allow / reject / ask). ``ask``
sends a ``session.update`` of type ``permission`` on the turn's own stream and,
through the broker's listeners, to every ``bridge.watch`` watcher and the
session store (so a reconnecting client finds it in ``permission.list``). The
first valid ``session.permission {sessionId, requestId, optionId}`` wins, from
any transport; expiry, cancel, agent exit and the end of the turn resolve it
too. Every resolution is a :class:`PermissionRecord` saying how and by whom
(transport and address), written to the audit log and published.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.sessions import SESSION_FORBIDDEN
from xwm_bridge.jsonrpc import FORBIDDEN, INVALID_PARAMS, RpcError
from xwm_bridge.observability.logging import events
from xwm_bridge.providers.stdio import mapping
from xwm_bridge.store.records import Answerer, PermissionRecord

AUDIT_LOGGER = "xwm_bridge.permissions"
#: resolved requests kept for ``permission.list`` (and "already answered by …")
RESOLVED_HISTORY = 256
#: resolutions
SELECTED = "selected"
EXPIRED = "expired"
CANCELLED = "cancelled"
AGENT_EXITED = "agent_exited"
TURN_ENDED = "turn_ended"
POLICY = "policy"
#: every resolution (``xwm_permission_requests_total{resolution}``)
RESOLUTIONS = frozenset({SELECTED, EXPIRED, CANCELLED, AGENT_EXITED, TURN_ENDED, POLICY})

_ids = itertools.count(1)

#: ``(event type, record)``: ``requested`` or ``resolved``
Listener = Callable[[str, PermissionRecord], None]


@dataclass(frozen=True, slots=True)
class PermissionAnswer:
    """Typed params of ``session.permission``."""

    session_id: str
    request_id: str
    option_id: str

    @classmethod
    def parse(cls, params: dict[str, Any]) -> PermissionAnswer:
        values = {}
        for key in ("sessionId", "requestId", "optionId"):
            value = params.get(key)
            if not isinstance(value, str) or not value.strip():
                raise RpcError(INVALID_PARAMS, f"{key} is required (a non-empty string)")
            values[key] = value.strip()
        return cls(values["sessionId"], values["requestId"], values["optionId"])


@dataclass(slots=True)
class PendingPermission:
    session_id: str
    request_id: str
    option_ids: frozenset[str]
    future: asyncio.Future[dict[str, Any]]
    record: PermissionRecord = field(default_factory=lambda: PermissionRecord("", ""))


def option_kind(options: Any, option_id: str) -> str:
    for opt in options if isinstance(options, (list, tuple)) else []:
        if isinstance(opt, dict) and opt.get("optionId") == option_id:
            return coerce.text(opt.get("kind"), SELECTED)
    return SELECTED


def audit(record: PermissionRecord, decision: str = "ask") -> None:
    """One audit line per decision: ids, outcome, reason, who — never the tool input."""
    fields: dict[str, Any] = {
        "audit": True,
        "session_id": record.session_id[:128],
        "request_id": record.request_id,
        "turn_id": record.turn_id,
        "provider": record.provider,
        "tool_kind": coerce.text(record.tool_call.get("kind"), "other"),
        "decision": decision,
        "resolution": record.resolution,
        "outcome": record.outcome,
        "reason": record.reason,
    }
    if record.option_id:
        fields["option_id"] = record.option_id
    if record.by is not None:
        fields["by_transport"] = record.by.transport
        fields["by_address"] = record.by.address
    # nobody answered in time: the agent's tool call was rejected, which an operator
    # needs to see (a client that does not show permission requests, a console closed)
    line = events.warning if record.resolution == EXPIRED else events.info
    line(AUDIT_LOGGER, "permission decision", fields)


class PermissionBroker:
    """Pending ``ask`` requests, keyed by (bridge session id, request id)."""

    def __init__(self, owner: str = "", history: int = RESOLVED_HISTORY) -> None:
        self.owner = owner
        #: request ids are ``perm-<tag>-<n>``: a tag of this broker's own, so a restarted
        #: bridge or another replica never names a request with an id this one gave (an
        #: answer meant for one request could select an option of another)
        self.tag = secrets.token_hex(4)
        self.pending: dict[tuple[str, str], PendingPermission] = {}
        self.resolved: deque[PermissionRecord] = deque(maxlen=history)
        self.listeners: list[Listener] = []

    def _publish(self, type_: str, record: PermissionRecord) -> None:
        for listener in self.listeners:
            listener(type_, record)

    def open(
        self,
        session_id: str,
        options: Any,
        *,
        turn_id: str = "",
        provider: str = "",
        tool_call: dict[str, Any] | None = None,
        timeout: float = 0.0,
        principal: str = "",
    ) -> PendingPermission:
        request_id = f"perm-{self.tag}-{next(_ids)}"
        offered = tuple(
            o
            for o in (options if isinstance(options, list) else [])
            if isinstance(o, dict) and isinstance(o.get("optionId"), str)
        )
        now = time.time()
        record = PermissionRecord(
            session_id,
            request_id,
            turn_id=turn_id,
            provider=provider,
            tool_call=dict(tool_call or {}),
            options=offered,
            created_at=now,
            deadline=now + timeout if timeout > 0 else 0.0,
            owner=self.owner,
            principal=principal,
        )
        entry = PendingPermission(
            session_id,
            request_id,
            frozenset(o["optionId"] for o in offered),
            asyncio.get_running_loop().create_future(),
            record,
        )
        self.pending[(session_id, request_id)] = entry
        self._publish("requested", record)
        return entry

    def discard(self, entry: PendingPermission) -> None:
        """Forget a request whose turn no longer waits (resolved as ``turn_ended`` if open)."""
        self.resolve(entry, TURN_ENDED, "the turn stopped waiting", dict(mapping.CANCELLED_OUTCOME))
        self.pending.pop((entry.session_id, entry.request_id), None)

    def knows(self, session_id: str, request_id: str) -> bool:
        """Raised here: pending, or resolved recently."""
        key = (session_id, request_id)
        return key in self.pending or self.find_resolved(session_id, request_id) is not None

    def find_resolved(self, session_id: str, request_id: str) -> PermissionRecord | None:
        for record in reversed(self.resolved):
            if record.session_id == session_id and record.request_id == request_id:
                return record
        return None

    def answer(
        self,
        answer: PermissionAnswer,
        by: Answerer | None = None,
        may_answer: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """The first valid answer wins; a later one is told who answered first.

        ``may_answer(principal)``: may the caller answer a request raised by a turn
        of ``principal`` (the request's own, not its session's: the session may be
        gone, closed while its turn is still being cancelled)? Else ``-32003``."""
        entry = self.pending.get((answer.session_id, answer.request_id))
        if may_answer is not None:
            record = entry.record if entry is not None else None
            record = record or self.find_resolved(answer.session_id, answer.request_id)
            if record is not None and not may_answer(record.principal):
                raise RpcError(FORBIDDEN, SESSION_FORBIDDEN)
        if entry is None or entry.future.done():
            done = self.find_resolved(answer.session_id, answer.request_id)
            if done is not None:
                who = f" by {done.by.transport} {done.by.address}".rstrip() if done.by else ""
                raise RpcError(
                    INVALID_PARAMS,
                    f"permission request {answer.request_id} was already resolved "
                    f"({done.outcome or done.resolution}){who}",
                )
            raise RpcError(INVALID_PARAMS, "no pending permission request with that requestId")
        if answer.option_id not in entry.option_ids:
            raise RpcError(INVALID_PARAMS, "optionId is not one of the offered options")
        kind = option_kind(entry.record.options, answer.option_id)
        by = by or Answerer()
        self.resolve(
            entry,
            SELECTED,
            f"answered {kind} over {by.transport or 'an unknown transport'}",
            mapping.selected(answer.option_id),
            option_id=answer.option_id,
            outcome=kind,
            by=by,
        )
        return {
            "accepted": True,
            "requestId": answer.request_id,
            "optionId": answer.option_id,
            "outcome": kind,
        }

    def resolve(
        self,
        entry: PendingPermission,
        resolution: str,
        reason: str,
        outcome_value: dict[str, Any],
        *,
        option_id: str = "",
        outcome: str = "",
        by: Answerer | None = None,
    ) -> bool:
        """Answer the agent with ``outcome_value`` and record how; False if already done."""
        if entry.future.done():
            return False
        if not outcome:
            inner = outcome_value.get("outcome")
            oid = inner.get("optionId") if isinstance(inner, dict) else None
            if isinstance(oid, str):
                option_id = option_id or oid
                outcome = option_kind(entry.record.options, oid)
            else:
                outcome = CANCELLED
        entry.future.set_result(outcome_value)
        record = entry.record.resolved(
            resolution=resolution,
            option_id=option_id,
            outcome=outcome,
            reason=reason,
            by=by,
            resolved_at=time.time(),
        )
        entry.record = record
        self.resolved.append(record)
        audit(record)
        self._publish("resolved", record)
        return True

    def decided(self, record: PermissionRecord, decision: str) -> None:
        """A request the policy answered without asking: audited and published."""
        self.resolved.append(record)
        audit(record, decision)
        self._publish("resolved", record)

    def close_session(self, session_id: str, resolution: str, reason: str) -> int:
        """Resolve every open request of a session as ``cancelled`` (to the agent)."""
        count = 0
        for key, entry in list(self.pending.items()):
            if key[0] == session_id:
                count += self.resolve(entry, resolution, reason, dict(mapping.CANCELLED_OUTCOME))
        return count

    def decline(self, session_id: str, request_id: str, reason: str) -> bool:
        """Answer one open request ``cancelled`` (its asker chose none of the options);
        False if it is not open."""
        entry = self.pending.get((session_id, request_id))
        if entry is None:
            return False
        return self.resolve(entry, CANCELLED, reason, dict(mapping.CANCELLED_OUTCOME))

    def cancel_session(self, session_id: str) -> int:
        """Answer every pending request of a session with ``cancelled``."""
        return self.close_session(session_id, CANCELLED, "turn cancelled")

    def snapshot(
        self, *, include_resolved: bool = False, session_id: str = ""
    ) -> list[PermissionRecord]:
        out = [e.record for e in self.pending.values() if not e.future.done()]
        if include_resolved:
            out += list(self.resolved)
        if session_id:
            out = [r for r in out if r.session_id == session_id]
        return sorted(out, key=lambda r: (r.created_at, r.request_id))


def outcome_label(outcome: dict[str, Any], options: Any) -> str:
    """``allow_once`` / ``reject_once`` / ``cancelled`` … for the result record."""
    inner = outcome.get("outcome")
    if not isinstance(inner, dict) or inner.get("outcome") != "selected":
        return "cancelled"
    oid = inner.get("optionId")
    for opt in options if isinstance(options, list) else []:
        if isinstance(opt, dict) and opt.get("optionId") == oid:
            return coerce.text(opt.get("kind"), "selected")
    return "selected"
