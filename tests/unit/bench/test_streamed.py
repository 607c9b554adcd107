"""internal.bench.streamed: the streamed-turn timer and the prompt the fake splits in N."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from internal.bench.streamed import ECHO_PREFIX, StreamTimer, stream_prompt
from internal.peers.fake_acp import FakeState, _turn
from xwm_bridge.sse import encode_data


def _event(obj: dict[str, Any]) -> bytes:
    return encode_data(orjson.dumps(obj))


def _delta(seq: int) -> bytes:
    params = {"sessionId": "s", "turnId": "t", "seq": seq, "type": "delta", "delta": "x"}
    return _event({"jsonrpc": "2.0", "method": "session.update", "params": params})


STATUS = _event(
    {
        "jsonrpc": "2.0",
        "method": "session.update",
        "params": {"sessionId": "s", "seq": 1, "type": "status", "event": "started"},
    }
)
RESULT = _event({"jsonrpc": "2.0", "id": 7, "result": {"success": True, "output": "x"}})


def _bridge_body(deltas: int) -> list[bytes]:
    """Events as the bridge sends them: its status update, the relayed deltas, the result."""
    return [STATUS, *(_delta(i) for i in range(1, deltas + 1)), RESULT]


# --- stream_prompt against the fake's own split ---------------------------------------


@pytest.mark.parametrize("chunks", [1, 3, 50, 200])
async def test_the_fake_splits_the_prompt_into_exactly_chunks_pieces(chunks: int) -> None:
    prompt = stream_prompt(chunks)
    sent: list[dict[str, Any]] = []

    async def emit(message: dict[str, Any]) -> None:
        sent.append(message)

    envelope, raw, status = await _turn(
        FakeState(chunks=chunks), 1, {"sessionId": "s", "taskPrompt": prompt}, emit
    )
    assert (raw, status) == (None, 200)
    assert envelope is not None and envelope["result"]["success"] is True
    assert len(sent) == chunks
    assert {len(m["params"]["delta"]) for m in sent} == {20}
    assert "".join(m["params"]["delta"] for m in sent) == ECHO_PREFIX + prompt


def test_stream_prompt_piece_length_and_impossible_shapes() -> None:
    assert len(ECHO_PREFIX + stream_prompt(50, piece=7)) == 350
    with pytest.raises(ValueError):
        stream_prompt(0)
    with pytest.raises(ValueError):
        stream_prompt(1, piece=3)  # the output cannot be shorter than "echo: "


# --- StreamTimer ----------------------------------------------------------------------


def test_times_first_event_first_delta_and_result_and_counts() -> None:
    timer = StreamTimer(started=100.0)
    for i, event in enumerate(_bridge_body(50)):
        timer.feed(event, 100.0 + 0.001 * (i + 1))
    timer.close(200.0)
    assert timer.first_event == pytest.approx(0.001)  # the bridge's status update
    assert timer.first_delta == pytest.approx(0.002)  # the first relayed chunk
    assert timer.result_at == pytest.approx(0.052)
    assert (timer.notifications, timer.deltas) == (51, 50)
    assert timer.verdict(50) == ""
    assert timer.verdict(0) == ""  # 0: the count is not checked


def test_an_event_split_across_reads_counts_when_it_completes() -> None:
    timer = StreamTimer(started=0.0)
    event = _delta(1)
    timer.feed(event[:10], 1.0)
    assert timer.first_event is None
    timer.feed(event[10:], 2.0)
    assert timer.first_event == timer.first_delta == 2.0


def test_a_missing_delta_is_a_failed_answer() -> None:
    timer = StreamTimer(started=0.0)
    for event in _bridge_body(49):
        timer.feed(event, 1.0)
    assert timer.verdict(50) == "49 delta notifications, expected 50"


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([STATUS, _delta(1)], "stream ended without a result"),
        ([_event({"jsonrpc": "2.0", "id": 1, "result": {"success": False}})], "turn failed"),
        ([_event({"jsonrpc": "2.0", "id": 1, "error": {"code": -1}})], "turn failed"),
        ([RESULT, _delta(1)], "event after the result"),
        ([b"data: <html>\n\n"], "event is not JSON"),
        ([b"data: [1, 2]\n\n"], "not a JSON-RPC object"),
        ([b"data: [DONE]\n\n"], "event is not JSON"),
    ],
)
def test_broken_streams_are_failed_answers(events: list[bytes], problem: str) -> None:
    timer = StreamTimer(started=0.0)
    for event in events:
        timer.feed(event, 1.0)
    timer.close(1.0)
    assert problem in timer.verdict(0)


def test_a_result_without_the_closing_blank_line_counts_at_close() -> None:
    timer = StreamTimer(started=0.0)
    timer.feed(_delta(1) + RESULT[:-1], 1.0)  # one "\n" short
    assert timer.envelope is None
    timer.close(3.0)
    assert timer.result_at == 3.0
    assert timer.verdict(1) == ""


def test_keepalive_comments_are_not_events() -> None:
    timer = StreamTimer(started=0.0)
    timer.feed(b": keep-alive\n\n", 1.0)
    assert timer.first_event is None
    for event in _bridge_body(2):
        timer.feed(event, 2.0)
    assert (timer.first_event, timer.notifications) == (2.0, 3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=30), st.integers(0, 60))
def test_any_split_of_the_body_gives_the_same_counts(cuts: list[int], deltas: int) -> None:
    body = b"".join(_bridge_body(deltas))
    points = sorted({min(c, len(body)) for c in cuts})
    timer = StreamTimer(started=0.0)
    last = 0
    for n, point in enumerate([*points, len(body)]):
        timer.feed(body[last:point], float(n))
        last = point
    timer.close(99.0)
    assert (timer.notifications, timer.deltas) == (deltas + 1, deltas)
    assert timer.verdict(deltas) == ""
    assert timer.first_event is not None and timer.result_at is not None
    assert timer.first_event <= (timer.first_delta or timer.result_at) <= timer.result_at
