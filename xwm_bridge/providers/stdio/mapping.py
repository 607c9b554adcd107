"""ACP ``session/update`` → bridge ``session.update`` payloads, and turn results (sans-I/O).

Mapping (the payload is stamped with sessionId/threadId/turnId/seq by the bridge):

=========================== ====================================================================
ACP ``sessionUpdate``       bridge payload
=========================== ====================================================================
``agent_message_chunk``     ``{type:"delta", delta:<text>, pending:true, error:false, _meta}``
``agent_thought_chunk``     ``{type:"thought", delta:<text>, pending:true, error:false, _meta}``
``tool_call``               ``{type:"tool_call", toolCallId, title, kind, status, content,
                            locations, rawInput, rawOutput, _meta}``
``tool_call_update``        ``{type:"tool_call_update", toolCallId, status, title, kind, content,
                            locations, rawInput, rawOutput, _meta}``
``plan``                    ``{type:"plan", entries}``
``usage_update``            ``{type:"usage", usage:<the update minus sessionUpdate>}``
``user_message_chunk``      not relayed (the client's own prompt echoed back)
anything else               ``{type:"agent_update", sessionUpdate:<name>, update:<raw>}``
=========================== ====================================================================

Non-text content blocks of chunks become ``content`` (the raw block) with an empty ``delta``;
a text block with its own ``_meta`` is also kept as ``content``, next to its ``delta``.
``_meta`` (ACP's extension point) is the update's own, as the agent sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.modes import Mode
from xwm_bridge.providers import collector


def _raw_text(content: Any) -> str:
    """Text of a chunk without trimming: deltas are concatenated as sent."""
    if isinstance(content, dict) and content.get("type") == "text":
        text = content.get("text")
        return text if isinstance(text, str) else ""
    return ""


def _pick(update: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: update[k] for k in keys if k in update}


def _has_meta(block: Any) -> bool:
    return isinstance(block, dict) and "_meta" in block


def map_update(update: dict[str, Any]) -> dict[str, Any] | None:
    """One ACP update object (``params.update``) → bridge payload, or None to drop it."""
    kind = coerce.text(update.get("sessionUpdate"))
    if kind in ("agent_message_chunk", "agent_thought_chunk"):
        content = update.get("content")
        payload: dict[str, Any] = {
            "type": "delta" if kind == "agent_message_chunk" else "thought",
            "delta": _raw_text(content),
            "pending": True,
            "error": False,
        }
        if content is not None and (not payload["delta"] or _has_meta(content)):
            payload["content"] = content  # a text block's _meta goes on with the block
        if "_meta" in update:
            payload["_meta"] = update["_meta"]
        return payload
    if kind == "user_message_chunk":
        return None
    if kind == "tool_call":
        return {
            "type": "tool_call",
            **_pick(
                update,
                "toolCallId",
                "title",
                "kind",
                "status",
                "content",
                "locations",
                "rawInput",
                "rawOutput",
                "_meta",
            ),
        }
    if kind == "tool_call_update":
        return {
            "type": "tool_call_update",
            **_pick(
                update,
                "toolCallId",
                "status",
                "title",
                "kind",
                "content",
                "locations",
                "rawInput",
                "rawOutput",
                "_meta",
            ),
        }
    if kind == "plan":
        entries = update.get("entries")
        return {"type": "plan", "entries": entries if isinstance(entries, list) else []}
    if kind == "usage_update":
        return {"type": "usage", "usage": {k: v for k, v in update.items() if k != "sessionUpdate"}}
    return {"type": "agent_update", "sessionUpdate": kind, "update": update}


#: tool calls one turn's result lists (each is relayed as it comes; past this they are
#: counted in ``toolCallsDropped``)
MAX_TOOL_CALLS = 1024


@dataclass(slots=True)
class TurnTranscript:
    """What one prompt produced, to build the result: its text up to
    ``collector.MAX_TURN_OUTPUT_CHARS`` and up to :data:`MAX_TOOL_CALLS` tool calls
    (everything is relayed; only what the result keeps is bounded)."""

    chunks: list[str] = field(default_factory=list)
    tool_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    kept: int = 0
    truncated: bool = False
    dropped_calls: set[str] = field(default_factory=set)

    def observe(self, update: dict[str, Any]) -> None:
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            text = _raw_text(update.get("content"))
            if text and self.kept + len(text) <= collector.MAX_TURN_OUTPUT_CHARS:
                self.chunks.append(text)
                self.kept += len(text)
            elif text:
                self.truncated = True
        elif kind in ("tool_call", "tool_call_update"):
            tid = coerce.text(update.get("toolCallId"))
            if not tid:
                return
            entry = self.tool_calls.get(tid)
            if entry is None:
                if len(self.tool_calls) >= MAX_TOOL_CALLS:
                    if len(self.dropped_calls) < MAX_TOOL_CALLS * 64:  # a count, bounded
                        self.dropped_calls.add(tid)
                    return
                entry = self.tool_calls[tid] = {"toolCallId": tid}
            entry.update(_pick(update, "title", "kind", "status"))

    @property
    def output(self) -> str:
        return "".join(self.chunks).strip()


def turn_result(
    *,
    transcript: TurnTranscript,
    prompt_result: Any,
    provider_id: str,
    turn_id: str,
    agent_session_id: str,
    working_directory: str,
) -> dict[str, Any]:
    """Result of a completed prompt (forwarding.md §4.7 shape plus ``stopReason``);
    the executor adds ``usage`` (core/usage.py) and what the session ran with."""
    answer = prompt_result if isinstance(prompt_result, dict) else {}
    stop = coerce.text(answer.get("stopReason"), "end_turn")
    result: dict[str, Any] = {
        "success": stop != "refusal",
        "stopReason": stop,
        "provider": provider_id,
        "mode": Mode.SINGLE_AGENT.value,
        "turnId": turn_id,
        "agentSessionId": agent_session_id,
    }
    text = transcript.output
    if text:
        result["output"] = text
        result["summary"] = text
    if stop == "cancelled":
        result["success"] = False
        result["cancelled"] = True
        result["error"] = "turn cancelled"
    elif stop == "refusal":
        result["error"] = "agent refused the prompt"
    if transcript.truncated:
        result["outputTruncated"] = True
    if transcript.tool_calls:
        result["toolCalls"] = list(transcript.tool_calls.values())
    if transcript.dropped_calls:
        result["toolCallsDropped"] = len(transcript.dropped_calls)
    if working_directory:
        result["effectiveWorkingDirectory"] = working_directory
    return result


def permission_payload(request_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """The ``session.update`` of type ``permission`` that asks the client."""
    options = params.get("options")
    return {
        "type": "permission",
        "requestId": request_id,
        "toolCall": params.get("toolCall") if isinstance(params.get("toolCall"), dict) else {},
        "options": options if isinstance(options, list) else [],
        "pending": True,
        "error": False,
    }


def choose_option(options: Any, allow: bool) -> str | None:
    """Pick the option id for a policy decision: allow → ``allow_once`` (never
    ``allow_always``); reject → ``reject_once``, else ``reject_always``."""
    if not isinstance(options, list):
        return None
    wanted = ("allow_once",) if allow else ("reject_once", "reject_always")
    for kind in wanted:
        for opt in options:
            if isinstance(opt, dict) and opt.get("kind") == kind:
                oid = opt.get("optionId")
                if isinstance(oid, str) and oid:
                    return oid
    return None


def selected(option_id: str) -> dict[str, Any]:
    return {"outcome": {"outcome": "selected", "optionId": option_id}}


CANCELLED_OUTCOME: dict[str, Any] = {"outcome": {"outcome": "cancelled"}}
