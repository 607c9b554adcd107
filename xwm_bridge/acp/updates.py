"""Bridge → ACP, sans-I/O: notifications as ``session/update`` kinds, turn results as
stop reasons, ``permission`` updates as ``session/request_permission``, and a stored
session replayed (``session/load``). The prompt side is :mod:`.prompts`.

Bridge notification (``session.update`` / relayed upstream frame) → ACP update:

=============================== ==========================================================
bridge ``type``                 ACP ``sessionUpdate``
=============================== ==========================================================
``delta`` (or a bare ``delta``) ``agent_message_chunk`` (``content`` block when not text, or
                                when it is the delta's text block; an object ``_meta`` kept)
``thought``                     ``agent_thought_chunk`` (as ``delta``)
``step`` (multi-agent)          ``agent_thought_chunk`` ("Planner: …")
``tool_call``                   ``tool_call``
``tool_call_update``            ``tool_call_update``
``tool`` (gateway)              ``tool_call``, then ``tool_call_update``
``plan``                        ``plan``
``usage``                       ``usage_update`` (when it has ``used`` and ``size``)
``agent_update``                the agent's own update, for ``available_commands_update``
``status``, ``final``           nothing (the prompt response carries the end)
``permission``                  nothing here: the front door relays it as
                                ``session/request_permission``
=============================== ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.acp.content import commands_update, content_block, tool_content

STOP_REASONS = ("end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled")
#: stop reasons of other vocabularies (OpenAI-style gateways) → ACP
STOP_ALIASES = {
    "stop": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
    "aborted": "cancelled",
}
TOOL_KINDS = frozenset(
    (
        "read",
        "edit",
        "delete",
        "move",
        "search",
        "execute",
        "think",
        "fetch",
        "switch_mode",
        "other",
    )
)
TOOL_STATUSES = frozenset(("pending", "in_progress", "completed", "failed"))
PLAN_PRIORITIES = frozenset(("high", "medium", "low"))
PLAN_STATUSES = frozenset(("pending", "in_progress", "completed"))
OPTION_KINDS = frozenset(("allow_once", "allow_always", "reject_once", "reject_always"))
#: agent updates passed through as they are (the front door owns modes, options, titles)
PASSTHROUGH_UPDATES = frozenset(("available_commands_update",))
UPDATE_METHODS = ("session.update", "acp.session.update")
#: ledger frames the front door writes itself (replayed by ``session/load``)
USER_MESSAGE = "acp.user_message"
AGENT_MESSAGE = "acp.agent_message"


# --- bridge notifications → ACP updates ---------------------------------------------------


@dataclass(slots=True)
class TurnMapState:
    """What the mapping remembers within one turn."""

    #: text of ``agent_message_chunk`` updates sent (the final-output rule needs it)
    message_chars: int = 0
    #: gateway tool ids already announced with ``tool_call``
    tools: set[str] = field(default_factory=set)
    #: keep ``terminal`` tool-call content (only when the client runs the terminals)
    terminals: bool = False


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chunk(kind: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": content}


def _locations(items: Any) -> list[dict[str, Any]] | None:
    if not isinstance(items, list):
        return None
    out = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            loc: dict[str, Any] = {"path": item["path"]}
            line = item.get("line")
            if isinstance(line, int) and not isinstance(line, bool) and line >= 0:
                loc["line"] = line
            out.append(loc)
    return out


def tool_call_fields(p: Mapping[str, Any], terminals: bool, *, start: bool) -> dict[str, Any]:
    """``ToolCall`` / ``ToolCallUpdate`` fields from a bridge (or agent) tool payload."""
    tid = coerce.text(p.get("toolCallId"))
    out: dict[str, Any] = {"toolCallId": tid}
    title = coerce.text(p.get("title"))
    if title or start:
        out["title"] = title or tid
    kind = coerce.text(p.get("kind"))
    if kind or start:
        out["kind"] = kind if kind in TOOL_KINDS else "other"
    status = coerce.text(p.get("status"))
    if status in TOOL_STATUSES:
        out["status"] = status
    elif start:
        out["status"] = "pending"
    content = tool_content(p.get("content"), terminals)
    if content is not None:
        out["content"] = content
    locations = _locations(p.get("locations"))
    if locations is not None:
        out["locations"] = locations
    for key in ("rawInput", "rawOutput"):
        if key in p and p[key] is not None:
            out[key] = p[key]
    meta = p.get("_meta")
    if isinstance(meta, dict):  # ACP's extension point, as the agent sent it
        out["_meta"] = meta
    return out


def _plan(entries: Any) -> dict[str, Any]:
    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        content = coerce.text(e.get("content"))
        if not content:
            continue
        priority = coerce.text(e.get("priority"))
        status = coerce.text(e.get("status"))
        out.append(
            {
                "content": content,
                "priority": priority if priority in PLAN_PRIORITIES else "medium",
                "status": status if status in PLAN_STATUSES else "pending",
            }
        )
    return {"sessionUpdate": "plan", "entries": out}


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    used, size = _int(usage.get("used")), _int(usage.get("size"))
    if used is None or size is None:
        return None
    out: dict[str, Any] = {"sessionUpdate": "usage_update", "used": used, "size": size}
    cost = usage.get("cost")
    if (
        isinstance(cost, dict)
        and isinstance(cost.get("amount"), (int, float))
        and not isinstance(cost.get("amount"), bool)
        and isinstance(cost.get("currency"), str)
    ):
        out["cost"] = {"amount": cost["amount"], "currency": cost["currency"]}
    return out


def _gateway_tool(p: Mapping[str, Any], state: TurnMapState) -> dict[str, Any] | None:
    tool = p.get("tool")
    data: dict[str, Any] = tool if isinstance(tool, dict) else {}
    tid = coerce.text(data.get("toolCallId")) or coerce.text(data.get("id"))
    if not tid:
        return None
    phase = coerce.text(data.get("phase")).lower()
    status = {"start": "in_progress", "update": "in_progress", "result": "completed"}.get(
        phase, "failed" if data.get("isError") is True or phase == "error" else "in_progress"
    )
    fields = {
        "toolCallId": tid,
        "title": coerce.text(data.get("name"), "tool"),
        "status": status,
    }
    if tid not in state.tools:
        state.tools.add(tid)
        return {"sessionUpdate": "tool_call", **fields, "kind": "other"}
    return {"sessionUpdate": "tool_call_update", "toolCallId": tid, "status": status}


def acp_updates(message: Mapping[str, Any], state: TurnMapState) -> list[dict[str, Any]]:
    """The ACP ``update`` objects one bridge notification means (often none)."""
    if message.get("method") not in UPDATE_METHODS:
        return []
    p = message.get("params")
    if not isinstance(p, dict):
        return []
    kind = coerce.text(p.get("type"))
    delta = p.get("delta")
    if kind in ("delta", "thought") or (not kind and isinstance(delta, str)):
        update_kind = "agent_thought_chunk" if kind == "thought" else "agent_message_chunk"
        block = content_block(p.get("content"))
        if isinstance(delta, str) and delta:
            if update_kind == "agent_message_chunk":
                state.message_chars += len(delta)
            if block is None or block.get("type") != "text" or block.get("text") != delta:
                block = _text_block(delta)  # the block, with its _meta, when it is the delta's
        if block is None:
            return []
        chunk = _chunk(update_kind, block)
        meta = p.get("_meta")
        if isinstance(meta, dict):  # ACP's extension point, as the agent sent it
            chunk["_meta"] = meta
        return [chunk]
    if kind == "step":
        title = coerce.text(p.get("title"), "Step")
        text = coerce.text(p.get("message"))
        return [_chunk("agent_thought_chunk", _text_block(f"{title}: {text}\n"))] if text else []
    if kind in ("tool_call", "tool_call_update"):
        if not coerce.text(p.get("toolCallId")):
            return []
        start = kind == "tool_call"
        return [{"sessionUpdate": kind, **tool_call_fields(p, state.terminals, start=start)}]
    if kind == "tool":
        update = _gateway_tool(p, state)
        return [update] if update is not None else []
    if kind == "plan":
        return [_plan(p.get("entries"))]
    if kind == "usage":
        usage = _usage(p.get("usage"))
        return [usage] if usage is not None else []
    if kind == "agent_update":
        update = p.get("update")
        if (
            isinstance(update, dict)
            and isinstance(update.get("sessionUpdate"), str)  # not an array: a set lookup
            and update.get("sessionUpdate") in PASSTHROUGH_UPDATES
            and commands_update(update)
        ):
            return [update]
    return []


def final_output(result: Mapping[str, Any]) -> str:
    for key in ("output", "summary"):
        value = result.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def stop_reason(result: Mapping[str, Any], cancel_requested: bool) -> str | None:
    """The ACP ``stopReason`` of a turn result; ``None`` for a failed turn (an error)."""
    if cancel_requested or result.get("cancelled") is True or result.get("aborted") is True:
        return "cancelled"
    reason = coerce.text(result.get("stopReason")).lower()
    reason = STOP_ALIASES.get(reason, reason)
    if reason in STOP_REASONS:
        return reason
    if result.get("success") is False:
        return None
    if result.get("mode") == "multi-agent" and result.get("approved") is False:
        return "max_turn_requests"  # max_iterations rounds, and the reviewer never approved
    return "end_turn"


# --- permission requests ------------------------------------------------------------------


def permission_request(session_id: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """``session/request_permission`` params from a bridge ``permission`` update."""
    tool = payload.get("toolCall") if isinstance(payload.get("toolCall"), dict) else {}
    assert isinstance(tool, dict)
    fields = tool_call_fields(tool, False, start=False)
    if not fields["toolCallId"]:
        fields["toolCallId"] = coerce.text(payload.get("requestId"), "permission")
    options = []
    for opt in payload.get("options") or []:
        if not isinstance(opt, dict) or not isinstance(opt.get("optionId"), str):
            continue
        kind = coerce.text(opt.get("kind"))
        options.append(
            {
                "optionId": opt["optionId"],
                "name": coerce.text(opt.get("name"), opt["optionId"]),
                "kind": kind if kind in OPTION_KINDS else "allow_once",
            }
        )
    return {"sessionId": session_id, "toolCall": fields, "options": options}


def chosen_option(answer: Any, options: list[dict[str, Any]]) -> str | None:
    """The option id the client selected; a ``cancelled`` outcome picks the reject option
    (the turn is being cancelled: the agent must not go on with the tool)."""
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    if not isinstance(outcome, dict):
        return None
    if outcome.get("outcome") == "selected":
        oid = outcome.get("optionId")
        return oid if isinstance(oid, str) and any(o["optionId"] == oid for o in options) else None
    for kind in ("reject_once", "reject_always"):
        for opt in options:
            if opt["kind"] == kind:
                return str(opt["optionId"])
    return None


# --- replay (session/load) ----------------------------------------------------------------


def user_message_updates(blocks: Any) -> list[dict[str, Any]]:
    out = []
    for block in blocks if isinstance(blocks, list) else []:
        content = content_block(block)
        if content is not None:
            out.append(_chunk("user_message_chunk", content))
    return out


def replay_updates(history: tuple[str, ...], ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stored session as ACP updates, oldest first: the prompts older than the ledger
    (text only), then what the ledger kept of each recent turn."""
    recorded = sum(1 for m in ledger if m.get("method") == USER_MESSAGE)
    out: list[dict[str, Any]] = []
    for prompt in history[: max(len(history) - recorded, 0)]:
        out.append(_chunk("user_message_chunk", _text_block(prompt)))
    state = TurnMapState()
    for message in ledger:
        method = message.get("method")
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        assert isinstance(params, dict)
        if method == USER_MESSAGE:
            state = TurnMapState()
            out += user_message_updates(params.get("prompt"))
        elif method == AGENT_MESSAGE:
            text = params.get("text")
            if isinstance(text, str) and text:
                out.append(_chunk("agent_message_chunk", _text_block(text)))
        else:
            out += acp_updates(message, state)
    return out
