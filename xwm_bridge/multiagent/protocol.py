"""Sans-I/O parts of the multi-agent loop: prompts, score parsing, step updates.

The loop itself (``executor.py``) only sequences model calls; everything that
decides *what* is sent or *how* an answer is read lives here and is unit-tested.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.modes import Mode

MODE = Mode.MULTI_AGENT.value
MISSING_KEY = "aiGatewayApiKey is required for multi-agent mode"
NO_PROMPT = "taskPrompt is required for multi-agent mode"
#: a client's own aiGatewayBaseUrl on a host outside ``multi_agent.allowed_hosts``
HOST_NOT_ALLOWED = (
    "aiGatewayBaseUrl host is not allowed for multi-agent mode (multi_agent.allowed_hosts)"
)

PLANNER_SYSTEM = (
    "You are the planner of a multi-agent coding team. Break the user's task into a short, "
    "numbered plan of concrete steps. Return only the plan."
)
WORKER_SYSTEM = (
    "You are a worker of a multi-agent coding team. Carry out the plan for the user's task "
    "and return the complete result. When reviewer feedback is given, revise the previous "
    "draft to address every point."
)
REVIEWER_SYSTEM = (
    "You are the reviewer of a multi-agent coding team. Check the draft against the task "
    "and the plan. Give concise feedback, then end with a last line of the form "
    "'SCORE: N/10' where N is an integer from 0 (unusable) to 10 (perfect)."
)

# "SCORE: 7/10", "Score = 7.5", "**Score:** 9 / 10" — the last one in the text wins.
# [0-9], not \d: \d also matches "٩", which float() reads as 9
_SCORE = re.compile(
    r"score\W{0,4}[:=]?\W{0,4}([0-9]+(?:\.[0-9]+)?)(?:\s*/\s*([0-9]+))?", re.IGNORECASE
)
_RATIO = re.compile(r"\b([0-9]+(?:\.[0-9]+)?)\s*/\s*10\b")


def parse_score(review: str) -> float | None:
    """The reviewer's score on a 0-10 scale, or None when the answer has none."""
    matches = list(_SCORE.finditer(review))
    if matches:
        m = matches[-1]
        value = float(m.group(1))
        scale = float(m.group(2)) if m.group(2) else 10.0
    else:
        ratios = list(_RATIO.finditer(review))
        if not ratios:
            return None
        value, scale = float(ratios[-1].group(1)), 10.0
    if scale <= 0:
        return None
    return round(max(0.0, min(10.0, value * 10.0 / scale)), 2)


def task_prompt(history: Sequence[str], task: str, attachments: Any) -> str:
    """§6.1-2: the session's user prompts as numbered turns, plus attachment lines."""
    if history:
        blocks = [f"## User Turn {i}\n{p}\n\n" for i, p in enumerate(history, 1)]
        prompt = "".join(blocks).strip()
    else:
        prompt = task.strip()
    lines = []
    if isinstance(attachments, list):
        for item in attachments:
            if not isinstance(item, dict):
                continue
            path = coerce.text(item.get("path"))
            if path:
                lines.append(f"- {coerce.text(item.get('name'), 'attachment')}: {path}")
    if lines:
        prompt = "User-selected local attachments:\n" + "\n".join(lines) + "\n\n" + prompt
    return prompt


def planner_messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": PLANNER_SYSTEM}, {"role": "user", "content": prompt}]


def worker_messages(
    prompt: str,
    plan: str,
    *,
    worker: int,
    workers: int,
    previous: str = "",
    feedback: str = "",
) -> list[dict[str, str]]:
    parts = [f"# Task\n{prompt}", f"# Plan\n{plan}"]
    if workers > 1:
        parts.append(
            f"# Your share\nYou are worker {worker} of {workers}: take the plan steps whose "
            f"number modulo {workers} is {worker % workers}, and only those."
        )
    if previous:
        parts.append(f"# Previous draft\n{previous}")
    if feedback:
        parts.append(f"# Reviewer feedback\n{feedback}\n\nRevise the draft accordingly.")
    return [
        {"role": "system", "content": WORKER_SYSTEM},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def merge_drafts(drafts: Sequence[str]) -> str:
    if len(drafts) == 1:
        return drafts[0]
    return "\n\n".join(f"## Worker {i}\n{d}" for i, d in enumerate(drafts, 1))


def reviewer_messages(prompt: str, plan: str, draft: str) -> list[dict[str, str]]:
    content = f"# Task\n{prompt}\n\n# Plan\n{plan}\n\n# Draft\n{draft}"
    return [
        {"role": "system", "content": REVIEWER_SYSTEM},
        {"role": "user", "content": content},
    ]


@dataclass(frozen=True, slots=True)
class Step:
    """One streamed ``step`` update (contract.md §13 planner/reviewer step shape)."""

    title: str
    role: str
    message: str
    iteration: int
    score: float = 0
    worker: int = 0

    def update(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "step",
            "mode": MODE,
            "title": self.title,
            "message": self.message,
            "pending": False,
            "error": False,
            "role": self.role,
            "iteration": self.iteration,
            "score": _number(self.score),
        }
        if self.worker:
            out["worker"] = self.worker
        return out


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def preparing(iteration: int = 1) -> Step:
    return Step("Planner", "architect", "Preparing multi-agent run", iteration)


def error_update(message: str) -> dict[str, Any]:
    """The spec's multi-agent error update (no ``event`` field)."""
    return {"type": "status", "mode": MODE, "message": message, "pending": False, "error": True}


def draft_stop(finish_reasons: Sequence[str]) -> str:
    """The ``stopReason`` of a draft from its workers' ``finish_reason``s: ``refusal``
    when one was filtered (``content_filter``), ``max_tokens`` when one was cut short
    (``length``), else ``""`` (none: the result has no ``stopReason``)."""
    if "content_filter" in finish_reasons:
        return "refusal"
    if "length" in finish_reasons:
        return "max_tokens"
    return ""


def success_result(
    turn_id: str,
    summary: str,
    score: float,
    iterations: int,
    *,
    approved: bool,
    plan: str,
    stop: str = "",
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "success": True,
        "summary": summary,
        "finalScore": _number(score),
        "iterations": iterations,
        "approved": approved,
        "plan": plan,
        "turnId": turn_id,
        "mode": MODE,
    }
    if stop:  # the single-agent results' field; only when the summary was cut or filtered
        result["stopReason"] = stop
    return result


def kept_draft(summary: str, score: float, iterations: int, plan: str) -> dict[str, Any]:
    """The fields a failure in a later round keeps (additive to ``failure_result``): the
    best reviewed draft so far, its score, the rounds reviewed and the plan. Not the
    draft's ``stopReason``: that of a failed turn says why the turn failed (``refusal``)."""
    return {
        "summary": summary,
        "finalScore": _number(score),
        "iterations": iterations,
        "approved": False,
        "plan": plan,
    }


def failure_result(turn_id: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"success": False, "error": message, **extra, "turnId": turn_id, "mode": MODE}
