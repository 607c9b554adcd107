"""Typed views of method params, parsed once at the dispatcher (contract.md §11)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

SESSION_ID_REQUIRED = "sessionId is required"
TASK_PROMPT_REQUIRED = "taskPrompt is required"


@dataclass(frozen=True, slots=True)
class SessionParams:
    session_id: str
    thread_id: str
    task_prompt: str
    working_directory: str
    #: ``None`` when missing, not an object, or empty (→ ROUTING_REQUIRED).
    routing: dict[str, Any] | None
    #: every key the client sent (the decoded request's own dict, not a copy: the
    #: request is not used after this); unknown keys are forwarded (forwarding.md §4.2).
    raw: Mapping[str, Any] = field(repr=False)  # its apiKey & co.: never in a repr

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> SessionParams:
        session_id = session_id_of(params)
        task_prompt = coerce.text(params.get("taskPrompt"))
        if not task_prompt:  # the original forwarded an empty turn to the agent
            raise RpcError(INVALID_PARAMS, TASK_PROMPT_REQUIRED)
        routing = params.get("routing")
        return cls(
            session_id=session_id,
            thread_id=coerce.text(params.get("threadId"), session_id),
            task_prompt=task_prompt,
            working_directory=coerce.path_text(params.get("workingDirectory"), "workingDirectory"),
            routing=routing if isinstance(routing, dict) and routing else None,
            raw=params,
        )


def session_id_of(params: Mapping[str, Any]) -> str:
    session_id = coerce.text(params.get("sessionId"))
    if not session_id:
        raise RpcError(INVALID_PARAMS, SESSION_ID_REQUIRED)
    return session_id
