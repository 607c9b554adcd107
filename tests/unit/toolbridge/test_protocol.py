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
    for frame in (b"3", b'"x"', b"null"):
        assert protocol.decode(frame) == jsonrpc.error(
            None,
            -32700,
            f"invalid json: expected a JSON object, got {protocol._kind(orjson.loads(frame))}",
        )


def test_an_array_is_a_batch() -> None:
    """A JSON array is a batch (it was ``-32700 … expected a JSON object, got array``,
    as if the JSON were broken, whatever the negotiated version)."""
    frame = b'[{"jsonrpc":"2.0","id":1,"method":"ping"}, 5]'
    assert protocol.decode(frame) == protocol.Batch(
        ({"jsonrpc": "2.0", "id": 1, "method": "ping"}, 5), frame
    )
    assert protocol.decode(b"[]") == protocol.Batch((), b"[]")


def _invalid(message: str) -> dict[str, Any]:
    return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, f"invalid request: {message}")


@pytest.mark.parametrize(
    ("version", "elements", "refusal"),
    [
        (None, (), _invalid("batches are not supported before initialize")),
        (
            None,
            ({"id": 1, "method": "ping"},),
            _invalid("batches are not supported before initialize"),
        ),
        (
            "2024-11-05",
            ({"id": 1, "method": "ping"},),
            _invalid("batches are not supported in protocol version 2024-11-05"),
        ),
        (
            "2025-06-18",
            ({"id": 1, "method": "ping"},),
            _invalid("batches are not supported in protocol version 2025-06-18"),
        ),
        ("2025-11-25", (), _invalid("batches are not supported in protocol version 2025-11-25")),
        ("2025-03-26", (), _invalid("empty batch")),
        (
            "2025-03-26",
            ({"method": "notifications/initialized"},) * 4,
            _invalid("a batch of 4 messages exceeds the limit of 3"),
        ),
        ("2025-03-26", ({"method": "notifications/initialized"},) * 3, None),
        ("2025-03-26", (7,), None),
    ],
)
def test_batch_refusal(version: str | None, elements: tuple[Any, ...], refusal: Any) -> None:
    """Only 2025-03-26 has batches; served, JSON-RPC 2.0 refuses an empty one, and a
    cap bounds the work one frame can start."""
    assert protocol.batch_refusal(protocol.Batch(elements, b"[]"), version, 3) == refusal


def test_batch_messages_decode_each_element() -> None:
    elements = (
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": 9, "result": {}},
        {"jsonrpc": "2.0", "id": "p", "method": "tools/list", "params": [1]},
        {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": {}},
        {"jsonrpc": "2.0", "method": "initialize"},
        [1],
        "x",
    )
    decoded = protocol.batch_messages(protocol.Batch(elements, orjson.dumps(list(elements))))
    assert decoded == [
        jsonrpc.Request("ping", {}, 1),
        jsonrpc.Request("notifications/initialized", {}, None),
        _invalid("id must not be null"),
        _invalid("id must be a string or a number"),
        None,
        jsonrpc.error("p", -32700, "invalid json: params must be an object, got array"),
        jsonrpc.error(
            2, -32600, "invalid request: initialize must not be part of a JSON-RPC batch"
        ),
        jsonrpc.Request("initialize", {}, None),
        _invalid("expected a JSON object, got array"),
        _invalid("expected a JSON object, got string"),
    ]


_ints = st.integers(-(2**53), 2**53)  # what orjson writes
_ids = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    st.text(max_size=3),
    st.lists(_ints, max_size=2),
)
_elements = st.one_of(
    _ints,
    st.none(),
    st.lists(_ints, max_size=2),
    st.dictionaries(
        st.sampled_from(["jsonrpc", "id", "ID", "method", "params", "result", "error"]),
        st.one_of(
            _ids,
            st.sampled_from(["ping", "initialize", " tools/list ", "notifications/cancelled"]),
            st.dictionaries(st.sampled_from(["a", "requestId"]), _ids, max_size=2),
        ),
    ),
)


@given(st.lists(_elements, max_size=8))
def test_a_batch_element_is_decoded_as_a_frame_would_be(elements: list[Any]) -> None:
    """Each element of a batch obeys the rules of a frame of its own (null and
    non-scalar ids, responses, a refused request's id), never raising; only a
    non-object and an ``initialize`` request are refused, ``-32600``."""
    frame = orjson.dumps(elements)
    decoded = protocol.batch_messages(protocol.Batch(tuple(elements), frame))
    assert len(decoded) == len(elements)
    for element, message in zip(elements, decoded, strict=True):
        if not isinstance(element, dict):
            assert message == _invalid(f"expected a JSON object, got {protocol._kind(element)}")
            continue
        alone = protocol.decode(orjson.dumps(element))
        if (
            isinstance(alone, jsonrpc.Request)
            and alone.method == "initialize"
            and alone.id is not None
        ):
            assert message == jsonrpc.error(alone.id, -32600, protocol.INITIALIZE_IN_BATCH)
        else:
            assert message == alone


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
        st.one_of(st.none(), _ints, st.text(), st.lists(_ints), st.just({})),
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


@pytest.mark.parametrize(
    "frame",
    [
        b'{"id":1,"method":"ping"}',
        b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
        b'{"jsonrpc":2,"id":1,"method":"ping"}',
        b'{"jsonrpc":null,"id":1,"method":"ping"}',
    ],
)
def test_the_jsonrpc_member_is_not_checked_as_the_contract_says(frame: bytes) -> None:
    """contract.md §8 (every bridge transport; adapters.md §2.1: the toolbridge's
    decoding is the same): ``jsonrpc`` is ignored, not validated, so a client the
    original served is still served (kept, unlike a null id: nothing goes unanswered)."""
    assert protocol.decode(frame) == jsonrpc.Request("ping", {}, 1)
