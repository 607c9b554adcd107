"""Records the operator views read back from the store (issue 13): turns, pending
permission requests, and the session-list query with its cursor paging."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

#: turns kept per session (the newest)
TURNS_PER_SESSION = 64
#: a stored turn result above this many bytes of JSON keeps only its small fields
MAX_RESULT_BYTES = 256 * 1024
#: result fields kept when the whole result is too large
SMALL_RESULT_KEYS = (
    "success",
    "error",
    "turnId",
    "provider",
    "mode",
    "stopReason",
    "usage",
    "cancelled",
    "resolvedExecutionTarget",
    "resolvedProviderId",
    "resolvedModel",
    "agentSessionId",
)
MAX_PROMPT_CHARS = 4000
MAX_OUTPUT_CHARS = 64 * 1024

#: ``session.list`` ``state`` filter values (``idle`` = not running)
SESSION_STATES = ("running", "completed", "failed", "cancelled", "interrupted", "idle")


def bound_result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The result as stored: whole when small, else its small fields, the output cut
    to ``MAX_OUTPUT_CHARS`` and ``truncated: true``."""
    if result is None:
        return None
    try:
        size = len(orjson.dumps(result))
    except TypeError:
        size = MAX_RESULT_BYTES + 1
    if size <= MAX_RESULT_BYTES:
        return result
    small = {k: result[k] for k in SMALL_RESULT_KEYS if k in result}
    output = result.get("output")
    if isinstance(output, str):
        small["output"] = output[:MAX_OUTPUT_CHARS]
    small["truncated"] = True
    return small


#: Not frozen: built twice per turn on the hot path, where a frozen dataclass's
#: ``object.__setattr__`` per field costs 3x; treat instances as immutable (they are
#: handed to the store's writer), and use ``dataclasses.replace`` to change one.
@dataclass(slots=True)
class TurnRecord:
    session_id: str
    turn_id: str
    thread_id: str = ""
    method: str = ""
    mode: str = ""
    target: str = ""
    provider: str = ""
    model: str = ""
    prompt: str = ""
    status: str = "running"
    started_at: float = 0.0
    finished_at: float = 0.0
    usage: dict[str, Any] | None = None
    error: str = ""
    result: dict[str, Any] | None = None

    def dumps(self) -> bytes:
        # orjson writes dataclasses itself: no asdict() deep copy of the result (~50 us)
        return orjson.dumps(self)

    @classmethod
    def loads(cls, raw: bytes | str) -> TurnRecord:
        data = orjson.loads(raw)
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def wire(self, *, with_result: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sessionId": self.session_id,
            "turnId": self.turn_id,
            "threadId": self.thread_id,
            "method": self.method,
            "mode": self.mode,
            "target": self.target,
            "provider": self.provider,
            "model": self.model,
            "prompt": self.prompt,
            "status": self.status,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at or None,
            "durationMs": round((self.finished_at - self.started_at) * 1000, 1)
            if self.finished_at
            else None,
            "usage": self.usage,
            "error": self.error or None,
        }
        if with_result:
            out["result"] = self.result
        return out


@dataclass(frozen=True, slots=True)
class Answerer:
    """Who answered a permission request (or what resolved it)."""

    transport: str = ""
    address: str = ""
    principal: str = ""

    def wire(self) -> dict[str, str]:
        return {"transport": self.transport, "address": self.address}


@dataclass(frozen=True, slots=True)
class PermissionRecord:
    """One ``ask`` permission request of a stdio agent, pending or resolved."""

    session_id: str
    request_id: str
    turn_id: str = ""
    provider: str = ""
    tool_call: dict[str, Any] = field(default_factory=dict)
    options: tuple[dict[str, Any], ...] = ()
    created_at: float = 0.0
    deadline: float = 0.0
    #: ``pending`` or ``resolved``
    state: str = "pending"
    #: resolution: ``selected`` (an option), ``expired``, ``cancelled``, ``agent_exited``…
    resolution: str = ""
    option_id: str = ""
    #: the option's kind (``allow_once``, ``reject_once``…) or ``cancelled``
    outcome: str = ""
    reason: str = ""
    by: Answerer | None = None
    resolved_at: float = 0.0
    #: the process (or replica) holding the request
    owner: str = ""
    #: who ran the turn that raised it (a digest, never on the wire): permission.list
    #: shows a client only its own, also once the session is gone
    principal: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_id, self.request_id)

    def resolved(self, **changes: Any) -> PermissionRecord:
        return replace(self, state="resolved", **changes)

    def dumps(self) -> bytes:
        return orjson.dumps(self)  # dataclasses, tuples and nested Answerer written natively

    @classmethod
    def loads(cls, raw: bytes | str) -> PermissionRecord:
        data = orjson.loads(raw)
        names = cls.__dataclass_fields__
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["options"] = tuple(o for o in kwargs.get("options") or () if isinstance(o, dict))
        by = kwargs.get("by")
        kwargs["by"] = Answerer(**by) if isinstance(by, dict) else None
        return cls(**kwargs)

    def wire(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "requestId": self.request_id,
            "turnId": self.turn_id,
            "provider": self.provider,
            "toolCall": self.tool_call,
            "options": list(self.options),
            "createdAt": self.created_at,
            "deadline": self.deadline,
            "state": self.state,
            "resolution": self.resolution or None,
            "optionId": self.option_id or None,
            "outcome": self.outcome or None,
            "reason": self.reason or None,
            "answeredBy": self.by.wire() if self.by is not None else None,
            "resolvedAt": self.resolved_at or None,
        }


@dataclass(frozen=True, slots=True)
class SessionQuery:
    state: str = ""
    provider: str = ""
    thread_id: str = ""
    updated_since: float = 0.0
    #: page after this (updated_at, session_id), newest first
    after: tuple[float, str] | None = None
    limit: int = 50
    #: only records whose upstream map has each of these keys, with that value
    #: (``None``: any value) — the ACP front door's own sessions, by cwd and owner
    upstream: tuple[tuple[str, str | None], ...] = ()
    #: only sessions of this principal (a caller that may not see every session)
    owner: str | None = None

    def matches(self, record: Any) -> bool:
        """The filters applied to a ``SessionRecord`` (and ``after``, for stores that page
        by filtering)."""
        if self.owner is not None and record.owner not in ("", self.owner):
            return False
        if self.upstream:
            have = dict(record.upstream)
            for key, value in self.upstream:
                if key not in have or (value is not None and have[key] != value):
                    return False
        if self.state == "idle":
            if record.last_turn_status == "running":
                return False
        elif self.state and record.last_turn_status != self.state:
            return False
        if self.provider and record.provider != self.provider:
            return False
        if self.thread_id and record.thread_id != self.thread_id:
            return False
        if self.updated_since and record.updated_at < self.updated_since:
            return False
        return self.after is None or (record.updated_at, record.session_id) < self.after


@dataclass(frozen=True, slots=True)
class SessionPage:
    #: (SessionRecord, its last TurnRecord or None), newest first
    items: list[tuple[Any, TurnRecord | None]]
    #: where the next page starts; None = no more
    next_after: tuple[float, str] | None = None


def encode_page_cursor(after: tuple[float, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([after[0], after[1]])).decode().rstrip("=")


def decode_page_cursor(text: str) -> tuple[float, str] | None:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = orjson.loads(raw)
    except (binascii.Error, ValueError, orjson.JSONDecodeError):
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], (int, float))
        and not isinstance(value[0], bool)
        and isinstance(value[1], str)
    ):
        return float(value[0]), value[1]
    return None
