"""Sans-I/O ACP pieces: line splitting, decoding, update mapping (recorded opencode frames)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from xwm_bridge.providers.stdio import codec, mapping

FRAMES = json.loads((Path(__file__).parent / "opencode_write_frames.json").read_text())


def test_line_splitter_reassembles_and_drops_oversized_lines() -> None:
    sp = codec.LineSplitter(limit=10)
    assert sp.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert sp.feed(b":2}\n\n") == [b'{"b":2}']
    # an oversized line is dropped up to its newline; the next one survives
    assert sp.feed(b"x" * 8) == []
    assert sp.feed(b"y" * 8) == []
    assert sp.feed(b"zz\nok\n") == [b"ok"]
    assert sp.dropped == 1
    assert sp.feed(b"q" * 50 + b"\n" + b"fine\n") == [b"fine"]
    assert sp.dropped == 2


def test_decode_kinds_and_separate_id_space() -> None:
    req = codec.decode(
        b'{"jsonrpc":"2.0","id":0,"method":"fs/read_text_file","params":{"path":"/x"}}'
    )
    assert req.kind == "request" and req.id == 0 and req.params == {"path": "/x"}
    sreq = codec.decode(b'{"jsonrpc":"2.0","id":"a-1","method":"session/request_permission"}')
    assert sreq.kind == "request" and sreq.id == "a-1"
    note = codec.decode(b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s"}}')
    assert note.kind == "notification"
    ok = codec.decode(b'{"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}')
    assert ok.kind == "response" and ok.result == {"stopReason": "end_turn"} and ok.error is None
    err = codec.decode(b'{"jsonrpc":"2.0","id":4,"error":{"code":-32000,"message":"boom"}}')
    assert err.kind == "response" and err.error == {"code": -32000, "message": "boom"}
    assert codec.decode(b"not json").kind == "invalid"
    assert codec.decode(b"[1]").kind == "invalid"
    assert codec.decode(b'{"jsonrpc":"2.0"}').kind == "invalid"
    ids = codec.IdSpace()
    assert [ids.next(), ids.next()] == [1, 2]


def test_encoders_and_initialize() -> None:
    assert orjson.loads(codec.request(1, "initialize", {})) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {},
    }
    assert codec.error_response("x", -32002, "Resource not found").endswith(b"\n")
    params = codec.initialize_params(
        1, codec.client_capabilities(fs_read=True, fs_write=False, terminal=False)
    )
    assert params["protocolVersion"] == 1
    assert params["clientCapabilities"] == {
        "fs": {"readTextFile": True, "writeTextFile": False},
        "terminal": False,
    }


def test_recorded_opencode_frames_map_to_bridge_updates() -> None:
    updates = [f["update"] for f in FRAMES if "update" in f]
    mapped = [mapping.map_update(u) for u in updates]
    kinds = [m["type"] for m in mapped if m is not None]
    assert kinds == [
        "agent_update",
        "delta",
        "delta",
        "delta",
        "tool_call",
        "tool_call_update",
        "tool_call_update",
        "delta",
        "delta",
        "delta",
    ]
    tool = next(m for m in mapped if m and m["type"] == "tool_call")
    assert tool["toolCallId"] == "call_0" and tool["kind"] == "edit"
    done = [m for m in mapped if m and m["type"] == "tool_call_update"][-1]
    assert done["status"] == "completed"
    transcript = mapping.TurnTranscript()
    for u in updates:
        transcript.observe(u)
    assert transcript.output.startswith("FAKE-LLM says: hello there")
    assert transcript.tool_calls["call_0"]["status"] == "completed"


def test_other_update_kinds() -> None:
    assert mapping.map_update({"sessionUpdate": "user_message_chunk", "content": {}}) is None
    thought = mapping.map_update(
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}
    )
    assert thought == {"type": "thought", "delta": "hmm", "pending": True, "error": False}
    image = mapping.map_update(
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "data": "…"}}
    )
    assert image is not None and image["delta"] == "" and image["content"]["type"] == "image"
    assert mapping.map_update({"sessionUpdate": "plan", "entries": [{"content": "a"}]}) == {
        "type": "plan",
        "entries": [{"content": "a"}],
    }
    assert mapping.map_update({"sessionUpdate": "usage_update", "used": 1, "size": 9}) == {
        "type": "usage",
        "usage": {"used": 1, "size": 9},
    }


def test_turn_result_shapes() -> None:
    t = mapping.TurnTranscript(chunks=["hel", "lo "])
    ok = mapping.turn_result(
        transcript=t,
        prompt_result={"stopReason": "end_turn", "usage": {"totalTokens": 6}},
        provider_id="opencode",
        turn_id="turn-1",
        agent_session_id="ses_1",
        working_directory="/srv",
    )
    assert ok["success"] is True and ok["output"] == "hello" and ok["summary"] == "hello"
    assert ok["stopReason"] == "end_turn" and "usage" not in ok  # executor.py adds usage
    assert ok["effectiveWorkingDirectory"] == "/srv" and ok["mode"] == "single-agent"
    cancelled = mapping.turn_result(
        transcript=mapping.TurnTranscript(),
        prompt_result={"stopReason": "cancelled"},
        provider_id="x",
        turn_id="t",
        agent_session_id="s",
        working_directory="",
    )
    assert cancelled["success"] is False and cancelled["cancelled"] is True


def test_permission_option_choice_never_allow_always() -> None:
    request = next(f for f in FRAMES if f.get("request") == "session/request_permission")
    options = request["params"]["options"]
    assert mapping.choose_option(options, True) == "once"
    assert mapping.choose_option(options, False) == "reject"
    only_always = [{"optionId": "a", "kind": "allow_always"}]
    assert mapping.choose_option(only_always, True) is None
    payload = mapping.permission_payload("perm-1", request["params"])
    assert payload["type"] == "permission" and payload["requestId"] == "perm-1"
    assert payload["toolCall"]["kind"] == "edit" and len(payload["options"]) == 3


def test_agent_messages_nested_past_the_cap() -> None:
    """issue 16 item 3: a deep answer to our request fails that request; anything else
    deep is invalid (never relayed nor stored)."""
    from tests.nesting import nested_json

    deep = nested_json(300)
    answer = codec.decode(f'{{"jsonrpc":"2.0","id":3,"result":{deep}}}'.encode())
    assert (answer.kind, answer.id, answer.result) == ("response", 3, None)
    assert answer.error is not None and "nested deeper" in answer.error["message"]
    note = codec.decode(f'{{"jsonrpc":"2.0","method":"session/update","params":{deep}}}'.encode())
    assert note.kind == "invalid"
    fine = codec.decode(f'{{"jsonrpc":"2.0","id":4,"result":{nested_json(64)}}}'.encode())
    assert fine.kind == "response" and fine.error is None


def test_content_blocks_follow_the_agents_prompt_capabilities() -> None:
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    res = {"type": "resource", "resource": {"uri": "file:///a", "text": "body"}}
    blocks = [{"type": "text", "text": "look"}, image, res]
    takes = {"agentCapabilities": {"promptCapabilities": {"image": True, "embeddedContext": True}}}
    assert codec.content_blocks(blocks, takes, "look") == blocks
    plain = codec.content_blocks(blocks, {}, "look")
    assert plain[0] == blocks[0]
    assert plain[1] == {"type": "text", "text": "[image/png omitted: this agent takes no images]"}
    assert plain[2] == {"type": "text", "text": '<resource uri="file:///a">\nbody\n</resource>'}
    assert codec.content_blocks(None, takes, "hi") == [{"type": "text", "text": "hi"}]


def test_a_turns_transcript_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's chunks and tool calls were all kept for the result: bounded now by
    ``MAX_TURN_OUTPUT_CHARS`` and ``MAX_TOOL_CALLS`` (relayed all the same)."""
    from xwm_bridge.providers import collector

    monkeypatch.setattr(collector, "MAX_TURN_OUTPUT_CHARS", 50)
    monkeypatch.setattr(mapping, "MAX_TOOL_CALLS", 3)
    t = mapping.TurnTranscript()
    for i in range(100):
        t.observe(
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"{i:03d} "},
            }
        )
        t.observe({"sessionUpdate": "tool_call", "toolCallId": f"c{i}", "title": "t"})
    t.observe({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed"})
    assert len(t.output) <= 50 and t.output.startswith("000 001")
    assert list(t.tool_calls) == ["c0", "c1", "c2"]
    assert t.tool_calls["c1"]["status"] == "completed"  # a known one is still updated
    result = mapping.turn_result(
        transcript=t,
        prompt_result={"stopReason": "end_turn"},
        provider_id="p",
        turn_id="t1",
        agent_session_id="a",
        working_directory="",
    )
    assert result["outputTruncated"] is True and result["toolCallsDropped"] == 97
