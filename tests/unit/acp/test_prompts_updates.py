"""Bridge notification → ACP update, ACP prompt → bridge turn, stop reasons, permission
and replay shapes; every ACP shape checked strictly against the official schema."""

from __future__ import annotations

from typing import Any

import pytest
from acp import schema
from pydantic import ValidationError

from tests.acp_schema import strict
from xwm_bridge.acp import prompts
from xwm_bridge.acp import updates as to_acp
from xwm_bridge.acp.prompts import PromptSupport
from xwm_bridge.acp.updates import TurnMapState
from xwm_bridge.jsonrpc import RpcError


def bridge(payload: dict[str, Any], *, relayed: bool = False) -> dict[str, Any]:
    base = {} if relayed else {"sessionId": "s1", "threadId": "s1", "turnId": "turn-1", "seq": 3}
    return {"jsonrpc": "2.0", "method": "session.update", "params": {**base, **payload}}


def updates(message: dict[str, Any], state: TurnMapState | None = None) -> list[dict[str, Any]]:
    out = to_acp.acp_updates(message, state or TurnMapState())
    for update in out:
        strict(schema.SessionNotification, {"sessionId": "s1", "update": update})
    return out


def test_the_strict_check_fails_on_a_bad_frame() -> None:
    good = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x"}}
    strict(schema.SessionNotification, {"sessionId": "s", "update": good})
    with pytest.raises(AssertionError):  # an unknown field is dropped by the model
        strict(schema.SessionNotification, {"sessionId": "s", "update": {**good, "extra": 1}})
    with pytest.raises(AssertionError):  # a bad optional value is salvaged to its default
        bad = {"sessionUpdate": "tool_call", "toolCallId": "t", "title": "x", "kind": "nope"}
        strict(schema.SessionNotification, {"sessionId": "s", "update": bad})


def test_deltas_thoughts_and_content_blocks() -> None:
    state = TurnMapState()
    assert updates(bridge({"type": "delta", "delta": "he", "pending": True}), state) == [
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "he"}}
    ]
    # an upstream frame relayed unchanged: a bare delta
    assert updates(bridge({"delta": "llo"}, relayed=True), state)[0]["content"]["text"] == "llo"
    assert state.message_chars == 5
    assert updates(bridge({"type": "thought", "delta": "hmm"}), state) == [
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}
    ]
    assert state.message_chars == 5
    link = {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"}
    assert updates(bridge({"type": "delta", "delta": "", "content": link})) == [
        {"sessionUpdate": "agent_message_chunk", "content": link}
    ]
    assert updates(bridge({"type": "delta", "delta": ""})) == []


def test_tool_calls_are_normalized() -> None:
    start = bridge(
        {
            "type": "tool_call",
            "toolCallId": "c1",
            "title": "Write a.txt",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": "/w/a.txt", "line": 3}, {"nope": 1}],
            "rawInput": {"path": "/w/a.txt"},
        }
    )
    assert updates(start) == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "c1",
            "title": "Write a.txt",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": "/w/a.txt", "line": 3}],
            "rawInput": {"path": "/w/a.txt"},
        }
    ]
    odd = updates(bridge({"type": "tool_call", "toolCallId": "c2", "kind": "weird"}))[0]
    assert odd["kind"] == "other" and odd["title"] == "c2" and odd["status"] == "pending"
    done = bridge(
        {
            "type": "tool_call_update",
            "toolCallId": "c1",
            "status": "completed",
            "content": [
                {"type": "content", "content": {"type": "text", "text": "ok"}},
                {"type": "diff", "path": "/w/a.txt", "newText": "x", "oldText": None},
                {"type": "terminal", "terminalId": "term-1"},
                {"type": "bogus"},
            ],
            "rawOutput": {"ok": True},
        }
    )
    (update,) = updates(done)
    assert [c["type"] for c in update["content"]] == ["content", "diff"]  # bridge's own terminal
    (kept,) = updates(done, TurnMapState(terminals=True))
    assert [c["type"] for c in kept["content"]] == ["content", "diff", "terminal"]
    assert updates(bridge({"type": "tool_call_update", "status": "completed"})) == []


def test_plan_usage_steps_gateway_tools_and_passthrough() -> None:
    (plan,) = updates(
        bridge(
            {
                "type": "plan",
                "entries": [
                    {"content": "a", "priority": "high", "status": "pending"},
                    {"content": "b", "priority": "urgent", "status": "??"},
                    {"priority": "low"},
                ],
            }
        )
    )
    assert plan["entries"][1] == {"content": "b", "priority": "medium", "status": "pending"}
    assert len(plan["entries"]) == 2
    (usage,) = updates(bridge({"type": "usage", "usage": {"used": 42, "size": 1000}}))
    assert usage == {"sessionUpdate": "usage_update", "used": 42, "size": 1000}
    cost = {"used": 1, "size": 2, "cost": {"amount": 0.5, "currency": "USD"}}
    assert updates(bridge({"type": "usage", "usage": cost}))[0]["cost"]["currency"] == "USD"
    assert updates(bridge({"type": "usage", "usage": {"inputTokens": 3}})) == []
    (step,) = updates(bridge({"type": "step", "title": "Planner", "message": "1. do it"}))
    assert step["sessionUpdate"] == "agent_thought_chunk"
    assert step["content"]["text"] == "Planner: 1. do it\n"
    state = TurnMapState()
    tool = {"type": "tool", "tool": {"toolCallId": "g1", "name": "search", "phase": "start"}}
    assert updates(bridge(tool), state)[0]["sessionUpdate"] == "tool_call"
    tool["tool"] = {"toolCallId": "g1", "phase": "result"}
    assert updates(bridge(tool), state) == [
        {"sessionUpdate": "tool_call_update", "toolCallId": "g1", "status": "completed"}
    ]
    commands = {"sessionUpdate": "available_commands_update", "availableCommands": []}
    assert updates(bridge({"type": "agent_update", "update": commands})) == [commands]
    mode = {"sessionUpdate": "current_mode_update", "currentModeId": "x"}
    assert updates(bridge({"type": "agent_update", "update": mode})) == []  # the bridge's own
    # an agent's update whose sessionUpdate is an array or an object is dropped, not a
    # TypeError in the turn's notify
    for odd in (["available_commands_update"], {"a": 1}):
        odd_update = {"sessionUpdate": odd, "availableCommands": []}
        assert updates(bridge({"type": "agent_update", "update": odd_update})) == []
    for quiet in ({"type": "status", "event": "started"}, {"type": "final", "message": "x"}):
        assert updates(bridge(quiet)) == []
    assert to_acp.acp_updates({"method": "other", "params": {}}, TurnMapState()) == []


def test_stop_reasons() -> None:
    assert to_acp.stop_reason({"success": True}, False) == "end_turn"
    assert to_acp.stop_reason({"success": True, "stopReason": "max_tokens"}, False) == "max_tokens"
    assert to_acp.stop_reason({"success": False, "stopReason": "refusal"}, False) == "refusal"
    assert to_acp.stop_reason({"success": True, "stopReason": "length"}, False) == "max_tokens"
    assert to_acp.stop_reason({"success": False, "cancelled": True}, False) == "cancelled"
    assert to_acp.stop_reason({"success": False, "aborted": True}, False) == "cancelled"
    assert to_acp.stop_reason({"success": True}, True) == "cancelled"
    assert to_acp.stop_reason({"success": False, "error": "down"}, False) is None
    # multi-agent: max_iterations rounds without the reviewer's approval
    unapproved = {"success": True, "mode": "multi-agent", "approved": False}
    assert to_acp.stop_reason(unapproved, False) == "max_turn_requests"
    assert to_acp.stop_reason({**unapproved, "approved": True}, False) == "end_turn"
    assert to_acp.stop_reason({**unapproved, "stopReason": "max_tokens"}, False) == "max_tokens"
    assert to_acp.stop_reason(unapproved, True) == "cancelled"
    for reason in to_acp.STOP_REASONS:
        strict(
            schema.PromptResponse,
            {"stopReason": to_acp.stop_reason({"stopReason": reason}, False)},
        )


def test_prompt_to_turn_params() -> None:
    blocks = prompts.check_prompt(
        [
            {"type": "text", "text": "review this"},
            {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"},
            {"type": "resource", "resource": {"uri": "file:///w/b.py", "text": "print(1)"}},
        ],
        PromptSupport(),
    )
    params = prompts.turn_params("s1", "/w", blocks, "single-agent:codex", "gpt-x")
    assert params == {
        "sessionId": "s1",
        "threadId": "s1",
        "taskPrompt": 'review this\n[a.py](file:///w/a.py)\n<resource uri="file:///w/b.py">\nprint(1)\n</resource>',
        "workingDirectory": "/w",
        "acpPrompt": blocks,  # not text only: the blocks go along for stdio agents
        "routing": {
            "routingMode": "explicit",
            "explicitExecutionTarget": "singleAgent",
            "explicitProviderId": "codex",
            "explicitModel": "gpt-x",
        },
    }
    assert "acpPrompt" not in prompts.turn_params("s1", "/w", blocks[:2], "auto", "")
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    assert prompts.check_prompt([image], PromptSupport(image=True)) == [image]
    assert prompts.prompt_text([image]) == "[image: image/png]"
    assert prompts.routing_params("auto", "") == {"routingMode": "auto"}
    assert prompts.routing_params("multi-agent", "")["explicitExecutionTarget"] == "multiAgent"
    gw = prompts.routing_params("gateway:openclaw", "")
    assert gw["explicitExecutionTarget"] == "gateway"
    assert gw["preferredGatewayProviderId"] == "openclaw"
    assert prompts.title_of("\n  fix the bug in parser.py\nmore") == "fix the bug in parser.py"
    assert len(prompts.title_of("x" * 200)) == 80


@pytest.mark.parametrize(
    "prompt",
    [
        [],
        "hello",
        [{"type": "image", "data": "AAAA", "mimeType": "image/png"}],
        [{"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}],
        [{"type": "text"}],
        [{"type": "resource_link"}],
        [{"type": "resource", "resource": "x"}],
        [{"type": "video"}],
        # a type that is not a string: -32602, not a TypeError (-32603, a traceback)
        [{"type": ["text"], "text": "x"}],
        [{"type": {"text": 1}, "text": "x"}],
    ],
)
def test_bad_prompts_are_invalid_params(prompt: Any) -> None:
    with pytest.raises(RpcError) as err:
        prompts.check_prompt(prompt, PromptSupport())
    assert err.value.code == -32602


@pytest.mark.parametrize(
    "block",
    [
        {"type": "image", "mimeType": "image/png"},  # no data
        {"type": "image", "data": "AAAA"},  # no mimeType
        {"type": "resource_link", "uri": "file:///a.txt"},  # ResourceLink requires a name
        {"type": "resource_link", "uri": "file:///a.txt", "name": 3},
        {"type": "resource", "resource": {"text": "x"}},  # no uri
        {"type": "resource", "resource": {"uri": "file:///a"}},  # neither text nor blob
    ],
)
def test_a_prompt_block_the_schema_rejects_is_invalid_params(block: dict[str, Any]) -> None:
    """``session/prompt`` params the ACP schema rejects are ``-32602`` naming the block,
    not a turn that sends them on to an agent (or replays them, invalid, on load)."""
    with pytest.raises(ValidationError):
        schema.PromptRequest.model_validate({"sessionId": "s", "prompt": [block]})
    with pytest.raises(RpcError) as err:
        prompts.check_prompt([{"type": "text", "text": "see"}, block], PromptSupport(image=True))
    assert err.value.code == -32602 and err.value.message.startswith("prompt[1]: "), err.value
    # what the schema takes passes, extra fields and _meta included (ACP tolerates them)
    link = {"type": "resource_link", "uri": "file:///a", "name": "a", "_meta": {"x": 1}}
    assert prompts.check_prompt([link], PromptSupport()) == [link]


def test_permission_request_and_answers() -> None:
    payload = {
        "type": "permission",
        "requestId": "perm-7",
        "toolCall": {"toolCallId": "c1", "title": "Write x", "kind": "edit", "status": "pending"},
        "options": [
            {"optionId": "once", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
            {"name": "broken"},
        ],
        "pending": True,
    }
    params = to_acp.permission_request("s1", payload)
    strict(schema.RequestPermissionRequest, params)
    assert [o["optionId"] for o in params["options"]] == ["once", "no"]
    options = params["options"]
    picked = {"outcome": {"outcome": "selected", "optionId": "once"}}
    assert to_acp.chosen_option(picked, options) == "once"
    assert (
        to_acp.chosen_option({"outcome": {"outcome": "selected", "optionId": "x"}}, options) is None
    )
    assert to_acp.chosen_option({"outcome": {"outcome": "cancelled"}}, options) == "no"
    assert to_acp.chosen_option({"nope": 1}, options) is None
    bare = to_acp.permission_request("s1", {"requestId": "perm-8", "options": []})
    assert bare["toolCall"] == {"toolCallId": "perm-8"}


def test_replay_of_a_stored_session() -> None:
    ledger = [
        bridge({"type": "status", "event": "started"}),
        {
            "method": to_acp.USER_MESSAGE,
            "params": {"prompt": [{"type": "text", "text": "second"}]},
        },
        bridge({"type": "delta", "delta": "answer two"}),
        bridge({"type": "tool_call", "toolCallId": "c1", "title": "t"}),
        {"method": to_acp.USER_MESSAGE, "params": {"prompt": [{"type": "text", "text": "third"}]}},
        {"method": to_acp.AGENT_MESSAGE, "params": {"text": "final only"}},
    ]
    out = to_acp.replay_updates(("first", "second", "third"), ledger)
    for update in out:
        strict(schema.SessionNotification, {"sessionId": "s1", "update": update})
    assert [(u["sessionUpdate"], u.get("content", {}).get("text")) for u in out] == [
        ("user_message_chunk", "first"),  # older than the ledger: the prompt only
        ("user_message_chunk", "second"),
        ("agent_message_chunk", "answer two"),
        ("tool_call", None),
        ("user_message_chunk", "third"),
        ("agent_message_chunk", "final only"),
    ]


@pytest.mark.parametrize(
    "content",
    [
        {"type": "text"},  # no text
        {"type": "text", "text": 5},
        {"type": "image", "mimeType": "image/png"},  # no data
        {"type": "image", "data": "iVBO"},  # no mimeType
        {"type": "audio", "data": "UklG", "mimeType": None},
        {"type": "resource_link", "uri": "file:///a.txt"},  # no name
        {"type": "resource_link", "name": "a", "uri": 7},
        {"type": "resource", "resource": {"text": "x"}},  # no uri
        {"type": "resource", "resource": {"uri": "file:///a"}},  # neither text nor blob
        {"type": "resource", "resource": "file:///a"},
    ],
)
def test_a_malformed_content_block_from_upstream_is_not_relayed(content: dict[str, Any]) -> None:
    """A bridge upstream is not an ACP peer: a block the schema would reject (required
    fields missing, wrong types) is dropped, never sent to the client as is (the SDK's
    client drops the whole notification; a strict one fails on it)."""
    assert updates(bridge({"type": "delta", "delta": "", "content": content})) == []
    tool = {"type": "tool_call", "toolCallId": "t1", "title": "x"}
    (update,) = updates(bridge({**tool, "content": [{"type": "content", "content": content}]}))
    assert update["content"] == []
    replayed = to_acp.user_message_updates([content, {"type": "text", "text": "kept"}])
    assert [u["content"] for u in replayed] == [{"type": "text", "text": "kept"}]


def test_a_malformed_tool_call_content_or_command_list_is_not_relayed() -> None:
    tool = {"type": "tool_call_update", "toolCallId": "t1"}
    diffs = [
        {"type": "diff", "path": "/a"},  # no newText
        {"type": "diff", "path": "/a", "newText": "b", "oldText": 3},
        {"type": "diff", "path": "/a", "newText": "b", "oldText": None},  # kept: nullable
    ]
    (update,) = updates(bridge({**tool, "content": diffs}))
    assert update["content"] == [diffs[2]]
    bad = {"sessionUpdate": "available_commands_update", "availableCommands": "nope"}
    assert updates(bridge({"type": "agent_update", "update": bad})) == []
    unnamed = {"sessionUpdate": "available_commands_update", "availableCommands": [{"x": 1}]}
    assert updates(bridge({"type": "agent_update", "update": unnamed})) == []
    # an input is an object with a hint (a strict client fails on any other)
    for bad_input in ("file name", {"hint": 3}, {}):
        command = {"name": "review", "description": "Review", "input": bad_input}
        odd = {"sessionUpdate": "available_commands_update", "availableCommands": [command]}
        assert updates(bridge({"type": "agent_update", "update": odd})) == [], bad_input
    command = {"name": "review", "description": "Review", "input": {"hint": "a path"}}
    good = {"sessionUpdate": "available_commands_update", "availableCommands": [command]}
    (update,) = updates(bridge({"type": "agent_update", "update": good}))
    assert update == good
    strict(schema.SessionNotification, {"sessionId": "s", "update": update})


@pytest.mark.parametrize(
    "blocks", [[{"type": "text", "text": ""}], [{"type": "text", "text": " \n"}] * 2]
)
def test_a_prompt_of_empty_text_is_invalid_params_naming_the_prompt(
    blocks: list[dict[str, Any]],
) -> None:
    with pytest.raises(RpcError) as err:
        prompts.check_prompt(blocks, PromptSupport())
    assert err.value.code == -32602 and err.value.message.startswith("prompt has no")


def test_a_tool_call_keeps_an_object_meta_and_drops_any_other() -> None:
    meta = {"claudeCode": {"toolName": "Bash"}}
    call = {"toolCallId": "t1", "title": "Run", "rawInput": {"cmd": "ls"}, "_meta": meta}
    out = to_acp.tool_call_fields(call, False, start=False)
    assert out["_meta"] == meta and out["rawInput"] == {"cmd": "ls"}
    strict(schema.ToolCallUpdate, out)
    assert "_meta" not in to_acp.tool_call_fields({**call, "_meta": "x"}, False, start=True)


def test_a_chunk_keeps_the_agents_meta_on_the_update_and_on_its_block() -> None:
    # a stdio agent's chunk, through the stdio mapping and the front door: an object
    # _meta (ACP's extension point) on the update and on its text block reaches the client
    from xwm_bridge.providers.stdio.mapping import map_update

    meta = {"fake/chunk": {"model": "alpha"}}
    block = {"type": "text", "text": "hi", "_meta": {"fake/block": 1}}
    for kind in ("agent_message_chunk", "agent_thought_chunk"):
        agent = {"sessionUpdate": kind, "content": block, "_meta": meta}
        payload = map_update(agent)
        assert payload is not None and payload["delta"] == "hi"
        assert updates(bridge(payload)) == [agent]
        plain = {"sessionUpdate": kind, "content": {"type": "text", "text": "hi"}}
        assert updates(bridge(map_update(plain) or {})) == [plain]
    # a _meta that is not an object is dropped (the schema wants one); a block that is
    # not the delta's text is not sent in its place
    odd = bridge({"type": "delta", "delta": "a", "_meta": "x", "content": {**block, "text": "b"}})
    assert updates(odd) == [
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "a"}}
    ]
