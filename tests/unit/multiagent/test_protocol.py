"""Sans-I/O multi-agent pieces: score parsing, prompt rendering, update shapes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.multiagent import protocol as p


@pytest.mark.parametrize(
    ("review", "score"),
    [
        ("Looks fine.\nSCORE: 9/10", 9),
        ("**Score:** 7 / 10", 7),
        ("score = 7.5", 7.5),
        ("Score: 3", 3),
        ("first draft score: 2/10 ... revised SCORE: 8/10", 8),
        ("I rate it 6/10 overall", 6),
        ("Score: 45/100", 4.5),
        ("SCORE: 14/10", 10),
        ("Rating 4 out of 5", None),
        ("no number here", None),
        ("", None),
    ],
)
def test_parse_score(review: str, score: float | None) -> None:
    assert p.parse_score(review) == score


@given(st.text())
def test_parse_score_is_total_and_bounded(text: str) -> None:
    score = p.parse_score(text)
    assert score is None or 0 <= score <= 10


def test_task_prompt_history_and_attachments() -> None:
    assert p.task_prompt([], "  solo  ", None) == "solo"
    assert p.task_prompt(["a", "b"], "b", None) == "## User Turn 1\na\n\n## User Turn 2\nb"
    attachments = [
        {"name": "spec", "path": "/w/spec.md"},
        {"path": "/w/x"},
        {"name": "blank", "path": "  "},
        "junk",
    ]
    assert p.task_prompt([], "do", attachments) == (
        "User-selected local attachments:\n- spec: /w/spec.md\n- attachment: /w/x\n\ndo"
    )


def test_step_shapes() -> None:
    assert p.preparing().update() == {
        "type": "step",
        "mode": "multi-agent",
        "title": "Planner",
        "message": "Preparing multi-agent run",
        "pending": False,
        "error": False,
        "role": "architect",
        "iteration": 1,
        "score": 0,
    }
    reviewer = p.Step("Reviewer", "tester", "ok", 2, 7.5).update()
    assert reviewer["score"] == 7.5 and reviewer["iteration"] == 2
    assert "worker" not in reviewer
    assert p.Step("Worker", "engineer", "d", 1, worker=2).update()["worker"] == 2
    assert p.error_update("boom") == {
        "type": "status",
        "mode": "multi-agent",
        "message": "boom",
        "pending": False,
        "error": True,
    }


def test_results() -> None:
    ok = p.success_result("t-1", "s", 9.0, 2, approved=True, plan="pl")
    assert ok == {
        "success": True,
        "summary": "s",
        "finalScore": 9,
        "iterations": 2,
        "approved": True,
        "plan": "pl",
        "turnId": "t-1",
        "mode": "multi-agent",
    }
    assert "output" not in ok
    # a summary cut short or filtered says so in the single-agent results' field
    cut = p.success_result("t-1", "s", 9.0, 2, approved=True, plan="pl", stop="max_tokens")
    assert cut == {**ok, "stopReason": "max_tokens"}


def test_draft_stop() -> None:
    assert p.draft_stop([]) == p.draft_stop(["stop", "", "tool_calls"]) == ""
    assert p.draft_stop(["stop", "length"]) == "max_tokens"
    assert p.draft_stop(["length", "content_filter"]) == "refusal"
    assert p.failure_result("t-1", "x") == {
        "success": False,
        "error": "x",
        "turnId": "t-1",
        "mode": "multi-agent",
    }


def test_worker_messages_carry_feedback_and_share() -> None:
    first = p.worker_messages("task", "plan", worker=1, workers=1)
    assert first[0]["role"] == "system"
    assert "Previous draft" not in first[1]["content"]
    rework = p.worker_messages(
        "task", "plan", worker=2, workers=3, previous="old", feedback="fix x"
    )
    text = rework[1]["content"]
    assert "# Previous draft\nold" in text and "fix x" in text
    assert "worker 2 of 3" in text
    assert p.merge_drafts(["only"]) == "only"
    assert p.merge_drafts(["a", "b"]) == "## Worker 1\na\n\n## Worker 2\nb"
