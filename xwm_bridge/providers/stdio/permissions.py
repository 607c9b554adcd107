"""Permission brokering between a stdio agent, the policy, and the client.

``session/request_permission`` → policy decision (allow / reject / ask). ``ask``
sends a ``session.update`` of type ``permission`` and waits for the client's
``session.permission {sessionId, requestId, optionId}`` up to a deadline. Each
decision is recorded so the turn result can say what happened and why.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.providers.stdio import mapping

_ids = itertools.count(1)


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


@dataclass(slots=True)
class PermissionBroker:
    """Pending ``ask`` requests, keyed by (bridge session id, request id)."""

    pending: dict[tuple[str, str], PendingPermission] = field(default_factory=dict)

    def open(self, session_id: str, options: Any) -> PendingPermission:
        request_id = f"perm-{next(_ids)}"
        ids = frozenset(
            o["optionId"]
            for o in (options if isinstance(options, list) else [])
            if isinstance(o, dict) and isinstance(o.get("optionId"), str)
        )
        entry = PendingPermission(
            session_id, request_id, ids, asyncio.get_running_loop().create_future()
        )
        self.pending[(session_id, request_id)] = entry
        return entry

    def discard(self, entry: PendingPermission) -> None:
        self.pending.pop((entry.session_id, entry.request_id), None)

    def answer(self, answer: PermissionAnswer) -> dict[str, Any]:
        entry = self.pending.get((answer.session_id, answer.request_id))
        if entry is None or entry.future.done():
            raise RpcError(INVALID_PARAMS, "no pending permission request with that requestId")
        if answer.option_id not in entry.option_ids:
            raise RpcError(INVALID_PARAMS, "optionId is not one of the offered options")
        entry.future.set_result(mapping.selected(answer.option_id))
        return {"accepted": True, "requestId": answer.request_id, "optionId": answer.option_id}

    def cancel_session(self, session_id: str) -> int:
        """Answer every pending request of a session with ``cancelled``."""
        count = 0
        for key, entry in list(self.pending.items()):
            if key[0] == session_id and not entry.future.done():
                entry.future.set_result(dict(mapping.CANCELLED_OUTCOME))
                count += 1
        return count


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
