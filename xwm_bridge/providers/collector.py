"""Notification collector and result assembly for single-agent turns (forwarding.md §4.6-4.7).

As the original, each streamed ``delta`` is trimmed and the non-blank ones are
joined with ``"\n"``: bridge-protocol upstreams send whole lines as deltas
(ACP agent chunks, which are pieces of one text, are concatenated by the stdio
executor instead). One collector bug of the original is fixed: an object
``message`` contributes its ``content``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce

_UPDATE_METHODS = ("session.update", "acp.session.update")
#: characters of streamed text one turn keeps for its result (every delta is relayed as
#: it comes; past this the result's output stops there and says ``outputTruncated``): a
#: turn may stream for an hour, and what it kept grew the process without bound
MAX_TURN_OUTPUT_CHARS = 8 * 1024 * 1024
_IGNORED_MESSAGES = ("session started", "single-agent completed")


def first_text(*values: Any) -> str:
    """The first value whose **text** is non-empty (missing ones cost no call)."""
    text = coerce.text
    for v in values:
        if v is None:
            continue
        t = v.strip() if type(v) is str else text(v)
        if t:
            return t
    return ""


@dataclass(slots=True)
class Collector:
    turn_id: str = ""
    working_directory: str = ""
    deltas: list[str] = field(default_factory=list)
    last_message: str = ""
    #: characters kept in ``deltas``, and whether some were not kept
    kept: int = 0
    truncated: bool = False

    def observe(self, frame: dict[str, Any]) -> None:
        if frame.get("method") not in _UPDATE_METHODS:
            return
        params = frame.get("params")
        if not isinstance(params, dict) or not params:
            return
        turn_id = coerce.text(params.get("turnId"))
        if turn_id:
            self.turn_id = turn_id
        wd = first_text(
            params.get("resolvedWorkingDirectory"),
            params.get("effectiveWorkingDirectory"),
            params.get("workingDirectory"),
        )
        if wd:
            self.working_directory = wd
        delta = params.get("delta")
        if isinstance(delta, str):
            delta = delta.strip()
            if delta and self.kept + len(delta) <= MAX_TURN_OUTPUT_CHARS:
                self.deltas.append(delta)
                self.kept += len(delta)
            elif delta:
                self.truncated = True
        message = params.get("message")
        if isinstance(message, dict):
            text = coerce.text(message.get("content"))
        else:
            text = coerce.text(message)
        if text and text not in _IGNORED_MESSAGES:
            self.last_message = text

    def apply(self, result: dict[str, Any]) -> None:
        text = first_text(
            result.get("output"),
            result.get("summary"),
            result.get("message"),
            "\n".join(self.deltas),
            self.last_message,
        )
        if text:
            result.setdefault("output", text)
            result.setdefault("summary", text)
        if self.truncated and "outputTruncated" not in result:
            result["outputTruncated"] = True
        if self.turn_id:
            result.setdefault("turnId", self.turn_id)
        if self.working_directory:
            result.setdefault("resolvedWorkingDirectory", self.working_directory)


def result_object(response: dict[str, Any]) -> dict[str, Any]:
    """§4.7 step 1: the ``result`` member if it is a non-empty object, else the envelope."""
    inner = response.get("result")
    if isinstance(inner, dict) and inner:
        return dict(inner)
    return dict(response)


def remote_fields(result: dict[str, Any], working_directory: str) -> None:
    """§4.8 metadata: remote working directory, ref kind, summary, remoteExecution."""
    remote_exec = result.get("remoteExecution")
    remote_exec = remote_exec if isinstance(remote_exec, dict) else {}
    rwd = first_text(
        result.get("remoteWorkingDirectory"),
        remote_exec.get("remoteWorkingDirectory"),
        result.get("resolvedWorkingDirectory"),
        result.get("effectiveWorkingDirectory"),
        working_directory,
    )
    kind = first_text(
        result.get("remoteWorkspaceRefKind"),
        remote_exec.get("remoteWorkspaceRefKind"),
        "remotePath",
    )
    result["remoteWorkingDirectory"] = rwd
    result["remoteWorkspaceRefKind"] = kind
    if not coerce.text(result.get("resultSummary")):
        summary = first_text(result.get("summary"), result.get("output"), result.get("message"))
        if summary:
            result["resultSummary"] = summary
    result["remoteExecution"] = {
        "remoteWorkingDirectory": rwd,
        "remoteWorkspaceRefKind": kind,
        "provider": coerce.text(result.get("provider")),
        "turnId": coerce.text(result.get("turnId")),
    }
