"""xwm_bridge.providers.collector: notification collector and result assembly (forwarding.md
§4.6-§4.8): deltas trimmed and joined with newlines as the original; object message → content."""

from __future__ import annotations

from typing import Any

import pytest

from xwm_bridge.providers import collector
from xwm_bridge.providers.collector import Collector, first_text, remote_fields, result_object


def update(method: str = "session.update", **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def collected(*frames: dict[str, Any]) -> Collector:
    c = Collector()
    for frame in frames:
        c.observe(frame)
    return c


# --- observe --------------------------------------------------------------------------


def test_observes_both_update_methods() -> None:
    c = collected(
        update(turnId="t1", delta="a"),
        update("acp.session.update", turnId="t2", delta="b"),
    )
    assert c.turn_id == "t2"
    assert c.deltas == ["a", "b"]


@pytest.mark.parametrize(
    "frame",
    [
        {"method": "session.other", "params": {"delta": "x", "turnId": "t"}},
        {"method": "Session.Update", "params": {"delta": "x"}},
        {"params": {"delta": "x"}},
        {"id": 1, "result": {"delta": "x"}},
        {"method": "session.update", "params": {}},
        {"method": "session.update", "params": None},
        {"method": "session.update", "params": ["delta"]},
        {"method": "session.update"},
    ],
)
def test_ignored_frames(frame: dict[str, Any]) -> None:
    c = collected(frame)
    assert c == Collector()


def test_turn_id_last_non_blank_wins() -> None:
    c = collected(update(turnId="t1"), update(turnId="  "), update(turnId=None), update(x=1))
    assert c.turn_id == "t1"
    c.observe(update(turnId=" t2 "))
    assert c.turn_id == "t2"


def test_numeric_turn_id_is_text() -> None:
    assert collected(update(turnId=17)).turn_id == "17"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {
                "resolvedWorkingDirectory": "/r",
                "effectiveWorkingDirectory": "/e",
                "workingDirectory": "/w",
            },
            "/r",
        ),
        ({"resolvedWorkingDirectory": " ", "effectiveWorkingDirectory": "/e"}, "/e"),
        ({"workingDirectory": " /w "}, "/w"),
        ({"resolvedWorkingDirectory": ""}, ""),
    ],
)
def test_working_directory_precedence(params: dict[str, Any], expected: str) -> None:
    assert collected(update(**params)).working_directory == expected


def test_working_directory_last_wins() -> None:
    c = collected(update(workingDirectory="/a"), update(workingDirectory=""), update(x=1))
    assert c.working_directory == "/a"
    c.observe(update(effectiveWorkingDirectory="/b"))
    assert c.working_directory == "/b"


def test_deltas_are_trimmed_and_joined_with_newlines_as_the_original() -> None:
    """Issue 15 item 4: bridge-protocol upstreams send whole lines as deltas; the
    original trims each and joins them with "\\n" (forwarding.md §4.6)."""
    c = collected(update(delta="Step 1 "), update(delta="  Step 2"), update(delta="done\n"))
    assert c.deltas == ["Step 1", "Step 2", "done"]
    result: dict[str, Any] = {}
    c.apply(result)
    assert result["output"] == "Step 1\nStep 2\ndone"


def test_blank_deltas_are_dropped() -> None:
    c = collected(update(delta="a"), update(delta=" "), update(delta="\n"), update(delta="b"))
    result: dict[str, Any] = {}
    c.apply(result)
    assert result["output"] == "a\nb"


@pytest.mark.parametrize("delta", ["", "  ", None, {"text": "x"}, ["x"]])
def test_non_string_or_empty_delta_ignored(delta: Any) -> None:
    assert collected(update(delta=delta)).deltas == []


def test_last_message_from_text() -> None:
    c = collected(update(message="first"), update(message="  second  "))
    assert c.last_message == "second"


@pytest.mark.parametrize(
    "ignored", ["session started", "single-agent completed", "  session started "]
)
def test_bridge_status_messages_are_ignored(ignored: str) -> None:
    c = collected(update(message="real"), update(message=ignored))
    assert c.last_message == "real"


def test_object_message_uses_content() -> None:
    c = collected(update(message={"role": "assistant", "content": " the answer "}))
    assert c.last_message == "the answer"


@pytest.mark.parametrize("message", [{"role": "assistant"}, {"content": "  "}, {"content": None}])
def test_object_message_without_content_ignored(message: dict[str, Any]) -> None:
    c = collected(update(message="kept"), update(message=message))
    assert c.last_message == "kept"


def test_object_message_content_may_be_ignored_text() -> None:
    c = collected(update(message="kept"), update(message={"content": "session started"}))
    assert c.last_message == "kept"


def test_numeric_message_is_text() -> None:
    assert collected(update(message=42)).last_message == "42"


# --- apply ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        # first non-blank of output, summary, message, deltas, last message;
        # output/summary are only set when absent (a blank present value is kept)
        (
            {"output": "o", "summary": "s", "message": "m"},
            {"output": "o", "summary": "s", "message": "m"},
        ),
        (
            {"output": "  ", "summary": "s", "message": "m"},
            {"output": "  ", "summary": "s", "message": "m"},
        ),
        ({"output": "  ", "message": "m"}, {"output": "  ", "summary": "m", "message": "m"}),
        ({"summary": "", "message": "m"}, {"output": "m", "summary": "", "message": "m"}),
        ({"summary": "s"}, {"output": "s", "summary": "s"}),
        ({}, {"output": "deltas", "summary": "deltas"}),
        ({"message": 7}, {"output": "7", "summary": "7", "message": 7}),
    ],
)
def test_apply_text_precedence(result: dict[str, Any], expected: dict[str, Any]) -> None:
    c = collected(update(delta="deltas"), update(message="last"))
    c.apply(result)
    assert result == expected


def test_apply_sets_output_and_summary_only_if_absent() -> None:
    c = collected(update(delta="streamed"))
    result: dict[str, Any] = {"output": "", "message": "msg"}
    c.apply(result)
    assert result["output"] == ""  # present (if blank) → kept
    assert result["summary"] == "msg"


def test_apply_falls_back_to_last_message() -> None:
    c = collected(update(message="only a message"))
    result: dict[str, Any] = {"success": True}
    c.apply(result)
    assert result == {"success": True, "output": "only a message", "summary": "only a message"}


def test_apply_prefers_deltas_over_last_message() -> None:
    c = collected(update(message="status"), update(delta="body"))
    result: dict[str, Any] = {}
    c.apply(result)
    assert result["output"] == "body"


def test_apply_without_text_sets_nothing() -> None:
    result: dict[str, Any] = {"success": False}
    Collector().apply(result)
    assert result == {"success": False}


def test_apply_turn_id_and_working_directory_only_if_absent() -> None:
    c = collected(update(turnId="t-up", workingDirectory="/w"))
    result: dict[str, Any] = {}
    c.apply(result)
    assert result["turnId"] == "t-up"
    assert result["resolvedWorkingDirectory"] == "/w"
    result = {"turnId": "t-own", "resolvedWorkingDirectory": "/own"}
    c.apply(result)
    assert result["turnId"] == "t-own"
    assert result["resolvedWorkingDirectory"] == "/own"


def test_apply_unknown_turn_id_not_set() -> None:
    result: dict[str, Any] = {"output": "x"}
    Collector().apply(result)
    assert "turnId" not in result
    assert "resolvedWorkingDirectory" not in result


def test_first_text() -> None:
    assert first_text(None, "", "  ", 0, "x") == "0"
    assert first_text(None, " a ") == "a"
    assert first_text() == ""
    assert first_text(None, "") == ""


# --- result_object (§4.7 step 1) ------------------------------------------------------


def test_result_object_uses_result_member() -> None:
    response = {"jsonrpc": "2.0", "id": "r", "result": {"success": True, "output": "pong"}}
    obj = result_object(response)
    assert obj == {"success": True, "output": "pong"}
    obj["added"] = 1
    assert "added" not in response["result"]  # a copy


@pytest.mark.parametrize("inner", [{}, None, [1], "text", 0])
def test_result_object_falls_back_to_envelope(inner: Any) -> None:
    response = {"jsonrpc": "2.0", "id": "r", "result": inner}
    obj = result_object(response)
    assert obj == response
    assert obj is not response


def test_result_object_without_result() -> None:
    response = {"jsonrpc": "2.0", "id": 1}
    assert result_object(response) == {"jsonrpc": "2.0", "id": 1}


# --- remote_fields (§4.8 metadata) ----------------------------------------------------


def test_remote_fields_from_request_working_directory() -> None:
    result: dict[str, Any] = {
        "success": True,
        "output": "pong",
        "turnId": "turn-upstream-1",
        "provider": "opencode",
    }
    remote_fields(result, "/srv/demo")
    assert result == {
        "success": True,
        "output": "pong",
        "turnId": "turn-upstream-1",
        "provider": "opencode",
        "remoteWorkingDirectory": "/srv/demo",
        "remoteWorkspaceRefKind": "remotePath",
        "resultSummary": "pong",
        "remoteExecution": {
            "remoteWorkingDirectory": "/srv/demo",
            "remoteWorkspaceRefKind": "remotePath",
            "provider": "opencode",
            "turnId": "turn-upstream-1",
        },
    }


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (
            {
                "remoteWorkingDirectory": "/a",
                "remoteExecution": {"remoteWorkingDirectory": "/b"},
                "resolvedWorkingDirectory": "/c",
                "effectiveWorkingDirectory": "/d",
            },
            "/a",
        ),
        (
            {
                "remoteWorkingDirectory": " ",
                "remoteExecution": {"remoteWorkingDirectory": "/b"},
                "resolvedWorkingDirectory": "/c",
            },
            "/b",
        ),
        ({"remoteExecution": "junk", "resolvedWorkingDirectory": "/c"}, "/c"),
        ({"effectiveWorkingDirectory": "/d"}, "/d"),
        ({}, "/param"),
    ],
)
def test_remote_working_directory_precedence(result: dict[str, Any], expected: str) -> None:
    remote_fields(result, "/param")
    assert result["remoteWorkingDirectory"] == expected
    assert result["remoteExecution"]["remoteWorkingDirectory"] == expected


def test_remote_working_directory_may_be_empty() -> None:
    result: dict[str, Any] = {}
    remote_fields(result, "")
    assert result["remoteWorkingDirectory"] == ""
    assert result["remoteExecution"] == {
        "remoteWorkingDirectory": "",
        "remoteWorkspaceRefKind": "remotePath",
        "provider": "",
        "turnId": "",
    }
    assert "resultSummary" not in result


def test_ref_kind_precedence() -> None:
    result: dict[str, Any] = {
        "remoteWorkspaceRefKind": "gitRef",
        "remoteExecution": {"remoteWorkspaceRefKind": "other"},
    }
    remote_fields(result, "")
    assert result["remoteWorkspaceRefKind"] == "gitRef"
    result = {"remoteExecution": {"remoteWorkspaceRefKind": "other", "extra": 1}}
    remote_fields(result, "")
    assert result["remoteWorkspaceRefKind"] == "other"
    assert "extra" not in result["remoteExecution"]  # replaced, not merged


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"resultSummary": "keep", "summary": "s"}, "keep"),
        ({"resultSummary": " ", "summary": "s", "output": "o"}, "s"),
        ({"output": "o", "message": "m"}, "o"),
        ({"message": "m"}, "m"),
    ],
)
def test_result_summary(result: dict[str, Any], expected: str) -> None:
    remote_fields(result, "")
    assert result["resultSummary"] == expected


def test_blank_result_summary_left_alone_without_text() -> None:
    result: dict[str, Any] = {"resultSummary": "  "}
    remote_fields(result, "")
    assert result["resultSummary"] == "  "


def test_collector_then_remote_fields_pipeline() -> None:
    c = collected(update(turnId="t9", delta="pi"), update(delta="ng"))
    result = result_object({"jsonrpc": "2.0", "id": 1, "result": {"success": True}})
    c.apply(result)
    remote_fields(result, "/w")
    assert result["output"] == result["summary"] == result["resultSummary"] == "pi\nng"
    assert result["remoteExecution"]["turnId"] == "t9"


def test_the_collected_output_of_a_turn_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every streamed delta was kept for the turn's result: an upstream streaming for
    the hour a turn may last grew the bridge's memory without bound. Past
    ``MAX_TURN_OUTPUT_CHARS`` the deltas are still relayed but no longer kept, and the
    result says ``outputTruncated``."""
    monkeypatch.setattr(collector, "MAX_TURN_OUTPUT_CHARS", 100)
    c = Collector()
    for i in range(1000):
        c.observe({"method": "session.update", "params": {"delta": f"line {i:04d}"}})
    assert sum(len(d) for d in c.deltas) <= 100
    result: dict[str, Any] = {}
    c.apply(result)
    assert result["output"].startswith("line 0000\nline 0001")
    assert result["outputTruncated"] is True
    small = Collector()
    small.observe({"method": "session.update", "params": {"delta": "hi"}})
    out: dict[str, Any] = {}
    small.apply(out)
    assert out["output"] == "hi" and "outputTruncated" not in out
