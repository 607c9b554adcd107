"""providers.upstream_call: frames nested past the cap are never relayed (issue 16 item 3)."""

from __future__ import annotations

import pytest

from tests.nesting import nested_json
from xwm_bridge.providers.upstream_call import (
    TOO_DEEP,
    Notification,
    UpstreamCall,
    UpstreamProtocolError,
)


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
