"""The ACP front door's frame classifier: requests, notifications, responses, errors."""

from __future__ import annotations

import pytest

from xwm_bridge import jsonrpc
from xwm_bridge.acp import codec


def test_request_notification_and_response() -> None:
    req = codec.decode(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"a":1}}')
    assert req == jsonrpc.Request("initialize", {"a": 1}, 0)
    note = codec.decode('{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}')
    assert isinstance(note, jsonrpc.Request) and note.is_notification
    assert codec.decode(b'{"jsonrpc":"2.0","method":"x"}') == jsonrpc.Request("x", {}, None)
    ok = codec.decode(b'{"jsonrpc":"2.0","id":3,"result":{"outcome":{"outcome":"cancelled"}}}')
    assert ok == codec.Response(3, {"outcome": {"outcome": "cancelled"}}, None)
    err = codec.decode(b'{"jsonrpc":"2.0","id":"a","error":{"code":-32002,"message":"nope"}}')
    assert err == codec.Response("a", None, {"code": -32002, "message": "nope"})
    odd = codec.decode(b'{"jsonrpc":"2.0","id":4,"error":"boom"}')
    assert isinstance(odd, codec.Response) and odd.error == {"code": -32603, "message": "boom"}


@pytest.mark.parametrize(
    ("frame", "code", "rid"),
    [
        (b'{"jsonrpc":"2.0","id":1,"method":"ini', jsonrpc.PARSE_ERROR, None),  # truncated
        (b"[1,2]", jsonrpc.INVALID_REQUEST, None),  # batch
        (b'"hello"', jsonrpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":7,"method":5}', jsonrpc.INVALID_REQUEST, 7),
        (
            b'{"jsonrpc":"2.0","id":7,"method":"session/new","params":[1]}',
            jsonrpc.INVALID_PARAMS,
            7,
        ),
        (b'{"jsonrpc":"2.0","id":{"x":1},"method":"a"}', jsonrpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":true,"method":"a"}', jsonrpc.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":9}', jsonrpc.INVALID_REQUEST, 9),
        (b'{"jsonrpc":"2.0"}', jsonrpc.INVALID_REQUEST, None),
    ],
)
def test_invalid_frames_get_an_error_to_send(frame: bytes, code: int, rid: object) -> None:
    item = codec.decode(frame)
    assert isinstance(item, codec.Invalid) and item.reply is not None
    assert item.reply["error"]["code"] == code
    assert item.reply["id"] == rid


def test_frames_nested_past_the_cap() -> None:
    """issue 16: params nested past 64 levels are -32602 with the id; a deep answer to one
    of the bridge's requests becomes an error answer (nothing of it is kept)."""
    from tests.nesting import nested_json

    deep = nested_json(300)
    request = codec.decode(f'{{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{deep}}}')
    assert isinstance(request, codec.Invalid) and request.reply is not None
    assert request.reply["id"] == 4 and request.reply["error"]["code"] == -32602
    answer = codec.decode(f'{{"jsonrpc":"2.0","id":9,"result":{deep}}}')
    assert isinstance(answer, codec.Response) and answer.result is None
    assert answer.error is not None and "nested deeper" in answer.error["message"]
    fine = codec.decode(
        f'{{"jsonrpc":"2.0","id":5,"method":"m","params":{{"a":{nested_json(63)}}}}}'
    )
    assert not isinstance(fine, codec.Invalid)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}',
        b'{"jsonrpc":"2.0","error":{"code":-32600,"message":"invalid request"}}',
        b'{"jsonrpc":"2.0","id":null,"result":{}}',
        b'{"jsonrpc":"2.0","id":null,"error":' + b'{"a":' * 70 + b"1" + b"}" * 71,
    ],
)
def test_a_response_without_an_id_is_never_answered(frame: bytes) -> None:
    """JSON-RPC 2.0: a response is never answered (a peer's error about one of our frames
    answered by an error of ours, which it answers again: a loop)."""
    item = codec.decode(frame)
    assert isinstance(item, codec.Invalid) and item.reply is None


def test_a_request_with_a_null_id_is_a_request() -> None:
    """ACP v1's RequestId includes null (JSON-RPC 2.0: discouraged, but a request, answered
    with id null); only a frame without an ``id`` member is a notification."""
    req = codec.decode(b'{"jsonrpc":"2.0","id":null,"method":"initialize","params":{}}')
    assert isinstance(req, jsonrpc.Request) and req.id is None
    assert not req.is_notification
    note = codec.decode(b'{"jsonrpc":"2.0","method":"initialize","params":{}}')
    assert isinstance(note, jsonrpc.Request) and note.is_notification
    bad = codec.decode(b'{"jsonrpc":"2.0","id":null,"method":"m","params":[1]}')
    assert isinstance(bad, codec.Invalid) and bad.reply is not None
    assert bad.reply["id"] is None and bad.reply["error"]["code"] == jsonrpc.INVALID_PARAMS


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","method":"session/cancel","params":["acp-1"]}',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":"acp-1"}',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"a":'
        + b'{"a":' * 70
        + b"1"
        + b"}" * 72,
    ],
)
def test_a_notification_is_never_answered(frame: bytes) -> None:
    """JSON-RPC 2.0: a notification gets no response, not even an error: one whose params
    are not an object (or nest past the cap) is dropped, not answered with id null."""
    item = codec.decode(frame)
    assert isinstance(item, codec.Invalid) and item.reply is None


def test_a_frame_too_large_is_answered_by_its_id_when_its_head_has_it() -> None:
    message = "message too large: limit is 64 bytes"
    request = codec.too_large(b'{"jsonrpc":"2.0","id":"p1","method":"session/prompt",', message)
    assert request == codec.Invalid(
        jsonrpc.error("p1", jsonrpc.INVALID_PARAMS, f"invalid params: {message}")
    )
    answer = codec.too_large(b'{"jsonrpc":"2.0","id":4,"result":{"content":"', message)
    assert isinstance(answer, codec.Response) and answer.id == 4 and answer.result is None
    assert answer.error == {
        "code": jsonrpc.INTERNAL_ERROR,
        "message": f"the ACP client's answer: {message}",
    }
    unknown = jsonrpc.error(None, jsonrpc.PARSE_ERROR, message)
    for head in (
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"x":"',  # id later, or none
        b'{"jsonrpc":"2.0","id":true,"method":"x","params":{',  # not an id
        b'{"jsonrpc":"2.0","id":null,"method":"x","params":{',
        b'{"jsonrpc":"2.0","id":5,"params":{',  # neither a request nor an answer yet
        b"not json at all",
    ):
        assert codec.too_large(head, message) == codec.Invalid(unknown), head
