"""Sans-I/O toolbridge pieces: MCP negotiation and params, LLM/Claude output parsing,
vault_kv argument validation."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge import jsonrpc
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.llm import LLMError, normalize_base_url, parse_completion
from xwm_bridge.toolbridge import protocol
from xwm_bridge.toolbridge.tools import (
    ToolError,
    claude_argv,
    go_duration,
    parse_claude_output,
)
from xwm_bridge.toolbridge.vault import VaultCall


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
        b'{"jsonrpc":"2.0","ID":null,"Method":"tools/list"}',  # the contract's case variants
        b'{"jsonrpc":"2.0","id":null,"method":"notifications/initialized"}',
    ],
)
def test_null_id_is_an_invalid_request(frame: bytes) -> None:
    """MCP: a request id MUST NOT be null (it decoded as a notification: run, unanswered)."""
    assert protocol.decode(frame) == jsonrpc.error(
        None, jsonrpc.INVALID_REQUEST, "invalid request: id must not be null"
    )


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","id":3,"result":{}}',
        b'{"jsonrpc":"2.0","id":"a","error":{"code":-32601,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}',
        b'{"jsonrpc":"2.0","ID":3,"Result":null}',
    ],
)
def test_a_response_is_dropped(frame: bytes) -> None:
    """The toolbridge sends no requests: a response is never answered."""
    assert protocol.decode(frame) is None


@pytest.mark.parametrize(
    ("frame", "rid", "code", "message"),
    [
        (
            b'{"id":1,"method":"ping","params":[]}',
            1,
            -32700,
            "invalid json: params must be an object, got array",
        ),
        (
            b'{"id":"a","method":"ping","params":"p"}',
            "a",
            -32700,
            "invalid json: params must be an object, got string",
        ),
        (b'{"id":2.5,"method":null}', 2.5, -32700, "missing method"),
        (b'{"id":0,"method":7}', 0, -32700, "invalid json: method must be a string, got number"),
    ],
)
def test_a_refused_request_is_answered_with_its_id(
    frame: bytes, rid: Any, code: int, message: str
) -> None:
    """A request the contract's decoding refuses is answered with its id when that is a
    string or a number (it was always id null, so the request went unanswered)."""
    assert protocol.decode(frame) == jsonrpc.error(rid, code, message)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"jsonrpc":"2.0","id":true,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":false,"method":"notifications/initialized"}',
        b'{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}',
        b'{"jsonrpc":"2.0","id":[1],"method":7}',
        b'{"jsonrpc":"2.0","Id":[[[]]]}',
    ],
)
def test_an_id_neither_string_nor_number_is_an_invalid_request(frame: bytes) -> None:
    """JSON-RPC 2.0: an id is a string, a number or null (it was served, echoed back)."""
    assert protocol.decode(frame) == jsonrpc.error(
        None, jsonrpc.INVALID_REQUEST, "invalid request: id must be a string or a number"
    )


def test_decode_keeps_the_contract_for_other_frames() -> None:
    notification = protocol.decode(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert isinstance(notification, jsonrpc.Request) and notification.is_notification
    for rid in (0, -1, 2.5, "", "r-1"):
        request = protocol.decode(orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": "ping"}))
        assert isinstance(request, jsonrpc.Request) and request.id == rid
    for frame in (b'{"id":null}', b'{"jsonrpc":"2.0"}'):
        assert protocol.decode(frame) == jsonrpc.error(None, -32700, "missing method")
    assert protocol.decode(b"[]") == jsonrpc.error(
        None, -32700, "invalid json: expected a JSON object, got array"
    )


@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        ("2024-11-05", "2024-11-05"),
        ("2025-06-18", "2025-06-18"),
        ("2025-11-25", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
        (None, "2025-11-25"),
        (5, "2025-11-25"),
    ],
)
def test_negotiate(asked: Any, answer: str) -> None:
    assert protocol.initialize_result({"protocolVersion": asked})["protocolVersion"] == answer


@pytest.mark.parametrize(
    ("params", "code", "message"),
    [
        ({"name": 5}, -32602, "invalid tool params: name must be a string, got number"),
        ({}, -32602, "invalid tool params: name must be a string, got null"),
        (
            {"name": "chat", "arguments": "x"},
            -32602,
            "invalid tool params: arguments must be an object, got string",
        ),
        ({"name": "rm"}, -32601, "unknown tool: rm"),
    ],
)
def test_tool_call_errors(params: dict[str, Any], code: int, message: str) -> None:
    with pytest.raises(RpcError) as err:
        protocol.ToolCall.parse(params)
    assert (err.value.code, err.value.message) == (code, message)


def test_tool_call_ok_and_results() -> None:
    assert protocol.ToolCall.parse({"name": "chat"}).arguments == {}
    assert protocol.tool_result("hi") == {"content": [{"type": "text", "text": "hi"}]}
    assert protocol.tool_error("x") == {
        "content": [{"type": "text", "text": "Error: x"}],
        "isError": True,
    }


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("", "https://api.openai.com/v1"),
        ("http://h/v1", "http://h/v1"),
        ("http://h/", "http://h/v1"),
        ("http://h/v1/", "http://h/v1/v1"),
    ],
)
def test_normalize_base_url(base: str, url: str) -> None:
    assert normalize_base_url(base) == url


def test_parse_completion() -> None:
    ok = b'{"choices":[{"message":{"content":"  hi  "}}]}'
    assert parse_completion(200, ok) == "hi"
    for status, raw, message in [
        (502, b" bad gateway \n", "api error 502: bad gateway"),
        (200, b'{"choices":[]}', "missing choices in response"),
        (200, b'{"choices":[{"message":{"content":"  "}}]}', "empty response content"),
        (200, b'{"choices":[{"message":{}}]}', "empty response content"),
    ]:
        with pytest.raises(LLMError, match=f"^{re.escape(message)}$"):
            parse_completion(status, raw)
    with pytest.raises(LLMError, match=r"^invalid JSON response"):
        parse_completion(200, b"<html>")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(600, "10m0s"), (1, "1s"), (1.5, "1.5s"), (0.25, "250ms"), (3661, "1h1m1s"), (90, "1m30s")],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_parse_claude_output() -> None:
    out = 'noise\n{"result": " ok "}\n{"partial": 1\n'
    assert parse_claude_output(out, "") == "ok"
    with pytest.raises(ToolError, match=r"^denied$"):
        parse_claude_output('{"is_error": true, "result": "denied"}', "")
    with pytest.raises(ToolError, match=r"^claude review returned empty output$"):
        parse_claude_output('{"result": ""}', "")
    with pytest.raises(ToolError, match=r"^claude CLI did not return JSON output\. stderr: e$"):
        parse_claude_output("[1]\ntext", " e ")
    with pytest.raises(ToolError, match=r"^claude CLI did not return JSON output$"):
        parse_claude_output("", "")


def test_claude_argv_defaults_and_overrides() -> None:
    cfg = ToolbridgeConfig(claude_review_system="sys", claude_review_tools="Read")
    assert claude_argv("c", cfg, {"prompt": "p", "tools": "Grep"}) == [
        "c",
        "-p",
        "--output-format",
        "json",
        "--permission-mode",
        "plan",
        "--system-prompt",
        "sys",
        "--tools",
        "Grep",
        "--",
        "p",
    ]
    with pytest.raises(ToolError, match=r"^prompt is required$"):
        claude_argv("c", cfg, {"prompt": "  "})


VAULT = ToolbridgeConfig(vault_url="http://127.0.0.1:1", vault_token="t")


def test_vault_call_parse() -> None:
    call = VaultCall.parse(
        VAULT, {"operation": "PUT", "path": "/a/b/", "data": {"k": 1}, "cas": 2.9}
    )
    assert call == VaultCall("write", "secret", "a/b", {"k": 1}, 2)
    listing = VaultCall.parse(VAULT, {"operation": "list", "mount": "/kv/", "path": ""})
    assert (listing.mount, listing.path) == ("kv", "")
    assert VaultCall.parse(VAULT, {"operation": "get", "path": "a", "cas": 0}).cas is None
    assert VaultCall.parse(VAULT, {"operation": "get", "path": "a", "cas": "x"}).cas is None


@pytest.mark.parametrize("cas", ["inf", "-Infinity", "1e400", float("inf")])
def test_vault_cas_infinite_is_ignored(cas: Any) -> None:
    """A ``cas`` string that parses as an infinite float is not an integer: it is
    ignored like any other non-number (it raised OverflowError: an internal error)."""
    call = VaultCall.parse(VAULT, {"operation": "put", "path": "a", "data": {"k": 1}, "cas": cas})
    assert call.cas is None


@pytest.mark.parametrize(
    ("cfg", "args", "message"),
    [
        (ToolbridgeConfig(), {}, "VAULT_SERVER_URL environment variable not set"),
        (
            ToolbridgeConfig(vault_url="http://x"),
            {},
            "VAULT_SERVER_ROOT_ACCESS_TOKEN environment variable not set",
        ),
        (VAULT, {"path": "a"}, "operation is required"),
        (VAULT, {"operation": "read", "path": "//"}, "path is required"),
        (VAULT, {"operation": "read", "path": "a", "data": "{"}, "data must be a JSON object"),
        (VAULT, {"operation": "nuke", "path": "a"}, "unsupported operation: nuke"),
        (VAULT, {"operation": "read", "path": "a//b"}, "invalid path: ''"),
        (VAULT, {"operation": "read", "path": "a/./b"}, "invalid path: '.'"),
        (VAULT, {"operation": "read", "path": "a%2e"}, "invalid path: 'a%2e'"),
        (VAULT, {"operation": "read", "path": "a\nb"}, "invalid path: 'a\\nb'"),
        # a segment ending in a newline: the pattern's ``$`` matched before it
        (VAULT, {"operation": "read", "path": "a\n/b"}, "invalid path: 'a\\n'"),
        (VAULT, {"operation": "read", "path": "..\n/b"}, "invalid path: '..\\n'"),
        (
            VAULT,
            {"operation": "write", "path": "a", "data": ""},
            "data is required for write operations",
        ),
        (
            ToolbridgeConfig(vault_url="u", vault_token="t", vault_allowed_paths=("secret/app",)),
            {"operation": "read", "path": "application/x"},
            "path not allowed: secret/application/x",
        ),
    ],
)
def test_vault_call_errors(cfg: ToolbridgeConfig, args: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolError) as err:
        VaultCall.parse(cfg, args)
    assert str(err.value) == message


@given(
    st.dictionaries(
        st.sampled_from(["name", "arguments", "x"]),
        st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()), st.just({})),
    )
)
def test_tool_call_parse_is_total(params: dict[str, Any]) -> None:
    """Any params either parse or raise a clean RpcError (never a traceback)."""
    try:
        call = protocol.ToolCall.parse(params)
    except RpcError as exc:
        assert exc.code in (-32601, -32602)
    else:
        assert call.name in protocol.TOOL_NAMES
