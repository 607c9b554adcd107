"""xwm_bridge.providers.upstream_call: the envelope and the sorting of frames, no sockets."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nesting import nested_json
from xwm_bridge.providers.upstream_call import (
    TOO_DEEP,
    Notification,
    Response,
    UpstreamCall,
    UpstreamProtocolError,
    classify,
)

MAX = 1 << 20


def note(n: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session.update", "params": {"delta": f"d{n}"}}


def sse(*objs: Any) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs)


def test_request_envelope_is_encoded_once_with_a_unique_id() -> None:
    a = UpstreamCall("session.message", {"sessionId": "s", "taskPrompt": "hi"})
    b = UpstreamCall("session.message", {"sessionId": "s"})
    env = orjson.loads(a.request)
    assert env == {
        "jsonrpc": "2.0",
        "id": a.rid,
        "method": "session.message",
        "params": {"sessionId": "s", "taskPrompt": "hi"},
    }
    assert a.rid != b.rid and a.rid.startswith("req-")


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        (note(1), Notification),
        ({"jsonrpc": "2.0", "id": "x", "result": {"ok": True}}, Response),
        ({"jsonrpc": "2.0", "id": "other", "result": None}, Response),  # tolerated id
        ({"jsonrpc": "2.0", "id": 3, "method": "fs/read", "params": {}}, type(None)),  # a request
        ({"jsonrpc": "2.0", "method": ""}, type(None)),
        ({"jsonrpc": "2.0"}, type(None)),
        ([1, 2], type(None)),
        ("text", type(None)),
    ],
)
def test_classify(frame: Any, kind: type) -> None:
    assert isinstance(classify(frame), kind)


def test_an_error_response_fails_with_its_message() -> None:
    with pytest.raises(UpstreamProtocolError) as err:
        classify({"id": 1, "error": {"code": -1, "message": "nope"}})
    assert str(err.value) == "nope" and err.value.kind == "remote_error"
    with pytest.raises(UpstreamProtocolError, match="external ACP request failed"):
        classify({"id": 1, "error": {"code": -1}})
    # an empty error object is not an error (the original's rule)
    assert isinstance(classify({"id": 1, "error": {}, "result": {}}), Response)


def test_plain_json_body() -> None:
    call = UpstreamCall("session.message", {})
    ev = call.body(b'{"jsonrpc":"2.0","id":"a","result":{"x":1}}', 200)
    assert ev.envelope["result"] == {"x": 1} and call.response is ev.envelope


@pytest.mark.parametrize(
    ("body", "status", "message", "kind"),
    [
        (b"<html>oops", 502, "upstream answered HTTP 502: <html>oops", "http_status"),
        (b"<html>oops", 200, "invalid upstream response:", "protocol"),
        (b"[1]", 200, "invalid upstream response: not a JSON object", "protocol"),
        (b'{"error":{"message":"denied"}}', 200, "denied", "remote_error"),
    ],
)
def test_bad_plain_json_bodies(body: bytes, status: int, message: str, kind: str) -> None:
    with pytest.raises(UpstreamProtocolError) as err:
        UpstreamCall("m", {}).body(body, status)
    assert str(err.value).startswith(message) and err.value.kind == kind


def test_sse_stream_relays_notifications_then_the_response() -> None:
    call = UpstreamCall("session.message", {})
    data = sse(note(1), note(2), {"id": call.rid, "result": {"done": True}}, note(3))
    events = call.sse(data, max_line=MAX)
    assert [type(e) for e in events] == [Notification, Notification, Response]
    assert call.response == {"id": call.rid, "result": {"done": True}}
    assert call.sse(sse(note(4)), max_line=MAX) == []  # nothing counts after the response


def test_sse_ignores_done_comments_and_junk() -> None:
    call = UpstreamCall("m", {})
    data = b": keep-alive\n\ndata: [DONE]\n\ndata: not json\n\nevent: x\ndata: [1]\n\n"
    assert call.sse(data, max_line=MAX) == []
    with pytest.raises(UpstreamProtocolError, match="ended without a response"):
        call.sse(b"", max_line=MAX)


def test_sse_last_event_without_blank_line_counts_at_end_of_stream() -> None:
    call = UpstreamCall("m", {})
    assert call.sse(b'data: {"id":"x","result":{"a":1}}', max_line=MAX) == []
    [ev] = call.sse(b"", max_line=MAX)
    assert isinstance(ev, Response) and call.response == {"id": "x", "result": {"a": 1}}


def test_sse_line_over_the_limit_is_a_protocol_error() -> None:
    with pytest.raises(UpstreamProtocolError, match="invalid upstream stream"):
        UpstreamCall("m", {}).sse(b"data: " + b"x" * 100, max_line=10)


def test_websocket_messages() -> None:
    call = UpstreamCall("m", {})
    assert call.message(b"garbage") == []
    assert isinstance(call.message(orjson.dumps(note(1)))[0], Notification)
    [ev] = call.message(orjson.dumps({"id": call.rid, "result": None}).decode())
    assert isinstance(ev, Response) and call.response == {"id": call.rid, "result": None}


FRAMES = st.one_of(
    st.builds(note, st.integers(0, 1000)),
    st.fixed_dictionaries(
        {
            "id": st.text(max_size=5),
            "result": st.dictionaries(st.text(), st.integers(-(2**63), 2**63 - 1)),
        }
    ),
    st.just({"jsonrpc": "2.0", "id": 7, "method": "fs/read_text_file"}),
    st.just("[DONE]"),
    st.just("not json"),
)


@settings(max_examples=200, deadline=None)
@given(
    frames=st.lists(FRAMES, max_size=12),
    cuts=st.lists(st.integers(0, 4000), max_size=8),
)
def test_sse_chunking_never_changes_the_events(frames: list[Any], cuts: list[int]) -> None:
    """However the bytes are split, the same notifications arrive, in order, and the
    response is the first result frame."""
    data = b"".join(
        b"data: " + (f.encode() if isinstance(f, str) else orjson.dumps(f)) + b"\n\n"
        for f in frames
    )
    whole = UpstreamCall("m", {}, rid="r")
    expected = whole.sse(data, max_line=MAX) if data else []
    pieces = sorted({c % (len(data) + 1) for c in cuts})
    split = UpstreamCall("m", {}, rid="r")
    got: list[Any] = []
    start = 0
    for cut in [*pieces, len(data)]:
        if cut > start:  # an empty chunk means end of stream
            got += split.sse(data[start:cut], max_line=MAX)
        start = max(start, cut)
    assert got == expected
    assert split.response == whole.response
    first_result = next((f for f in frames if isinstance(f, dict) and "result" in f), None)
    assert whole.response == first_result
    notes_before = []
    for f in frames:
        if f is first_result:
            break
        if isinstance(f, dict) and "method" in f and "id" not in f:
            notes_before.append(f)
    assert [e.message for e in expected if isinstance(e, Notification)] == notes_before


# --- nesting past the cap (issue 16 item 3) -------------------------------------------


def deep_response(call: UpstreamCall, depth: int = 300) -> bytes:
    return f'{{"jsonrpc":"2.0","id":"{call.rid}","result":{nested_json(depth)}}}'.encode()


def deep_notification(depth: int = 300) -> bytes:
    return f'{{"jsonrpc":"2.0","method":"session.update","params":{nested_json(depth)}}}'.encode()


def test_a_deep_plain_json_result_fails_the_call() -> None:
    call = UpstreamCall("session.start", {})
    with pytest.raises(UpstreamProtocolError, match="nested deeper than 64") as info:
        call.body(deep_response(call), 200)
    assert str(info.value) == TOO_DEEP and call.response is None


def test_a_result_at_the_cap_is_accepted() -> None:
    call = UpstreamCall("session.start", {})
    assert call.body(deep_response(call, 64), 200).envelope["id"] == call.rid


def test_deep_frames_on_ws_and_sse() -> None:
    ws = UpstreamCall("session.start", {})
    assert ws.message(deep_notification()) == []  # not relayed
    with pytest.raises(UpstreamProtocolError, match="nested deeper"):
        ws.message(deep_response(ws))
    sse = UpstreamCall("session.start", {})
    ok = b'{"jsonrpc":"2.0","method":"session.update","params":{"seq":1}}'
    events = sse.sse(b"data: " + deep_notification() + b"\n\ndata: " + ok + b"\n\n", max_line=10**7)
    assert [type(e) for e in events] == [Notification]
