"""xwm_bridge.jsonrpc: request decoding (contract.md §8) and envelope helpers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nesting import nested, nested_json
from xwm_bridge import jsonrpc
from xwm_bridge.jsonrpc import DecodeError, Request, decode_request

PROPS = settings(max_examples=200, deadline=None)


def _decode_error(data: bytes | str) -> str:
    with pytest.raises(DecodeError) as info:
        decode_request(data)
    assert str(info.value) == info.value.message
    return info.value.message


# --- valid requests -------------------------------------------------------------------


def test_full_request() -> None:
    req = decode_request(
        b'{"jsonrpc":"2.0","id":7,"method":"session.start","params":{"sessionId":"s1"}}'
    )
    assert req == Request(method="session.start", params={"sessionId": "s1"}, id=7)
    assert not req.is_notification


def test_str_input_is_accepted() -> None:
    req = decode_request('{"id":"a","method":"acp.capabilities"}')
    assert req.method == "acp.capabilities"
    assert req.id == "a"


@pytest.mark.parametrize(
    ("raw_id", "expected"),
    [
        ("1", 1),
        ("0", 0),
        ("-3", -3),
        ("1.5", 1.5),
        ('"task-1"', "task-1"),
        ('""', ""),
        ("true", True),
        ("[1]", [1]),
        ('{"a":1}', {"a": 1}),
    ],
)
def test_id_kinds_are_echoed(raw_id: str, expected: Any) -> None:
    req = decode_request(f'{{"id":{raw_id},"method":"m"}}')
    assert req.id == expected
    assert type(req.id) is type(expected)
    assert not req.is_notification


def test_large_integer_id_keeps_type_number() -> None:
    req = decode_request(b'{"id":12345678901234,"method":"m"}')
    assert req.id == 12345678901234


@pytest.mark.parametrize("body", ['{"id":null,"method":"m"}', '{"method":"m"}'])
def test_null_or_absent_id_is_notification(body: str) -> None:
    req = decode_request(body)
    assert req.id is None
    assert req.is_notification


@pytest.mark.parametrize("body", ['{"id":1,"method":"m"}', '{"id":1,"method":"m","params":null}'])
def test_absent_or_null_params_become_empty_object(body: str) -> None:
    req = decode_request(body)
    assert req.params == {}
    assert isinstance(req.params, dict)


def test_empty_params_object() -> None:
    assert decode_request('{"method":"m","params":{}}').params == {}


def test_params_are_kept_verbatim() -> None:
    params = {"a": [1, {"b": None}], "c": "  spaced  ", "d": 1.25}
    req = decode_request(orjson.dumps({"method": "m", "params": params}))
    assert req.params == params


def test_method_is_trimmed() -> None:
    assert decode_request('{"method":"  session.start \\n"}').method == "session.start"


def test_jsonrpc_member_is_not_validated() -> None:
    assert decode_request('{"jsonrpc":"1.0","method":"m"}').method == "m"
    assert decode_request('{"jsonrpc":5,"method":"m"}').method == "m"


def test_unknown_members_are_ignored() -> None:
    assert decode_request('{"method":"m","extra":[1,2,3]}').method == "m"


def test_surrounding_whitespace_is_fine() -> None:
    assert decode_request(b'  \n {"method":"m"} \r\n').method == "m"


# --- case-insensitive field names -----------------------------------------------------


def test_case_insensitive_field_names() -> None:
    req = decode_request('{"ID":3,"Method":"session.close","PARAMS":{"sessionId":"x"}}')
    assert req == Request(method="session.close", params={"sessionId": "x"}, id=3)


def test_exact_name_wins_over_case_variant() -> None:
    assert decode_request('{"Method":"other","method":"exact"}').method == "exact"
    assert decode_request('{"method":"exact","Method":"other"}').method == "exact"


def test_case_variant_with_bad_type_is_rejected() -> None:
    assert _decode_error('{"METHOD":42}').startswith("invalid json: ")
    assert _decode_error('{"method":"m","Params":[1]}').startswith("invalid json: ")


# --- decode errors --------------------------------------------------------------------


@pytest.mark.parametrize("params", ["[]", "[1,2]", '"x"', "1", "true", "false", "0"])
def test_params_array_or_scalar_is_invalid_json(params: str) -> None:
    message = _decode_error(f'{{"id":1,"method":"m","params":{params}}}')
    assert message.startswith("invalid json: ")


@pytest.mark.parametrize("method", ["1", "true", "[]", '{"a":1}', "1.5"])
def test_method_not_a_string_is_invalid_json(method: str) -> None:
    message = _decode_error(f'{{"id":1,"method":{method}}}')
    assert message.startswith("invalid json: ")
    assert message != jsonrpc.MISSING_METHOD


@pytest.mark.parametrize(
    "body",
    [
        '{"id":1}',
        '{"id":1,"method":null}',
        '{"id":1,"method":""}',
        '{"id":1,"method":"   "}',
        '{"id":1,"method":"\\t\\n"}',
        "{}",
        '{"params":{}}',
    ],
)
def test_missing_or_blank_method(body: str) -> None:
    assert _decode_error(body) == "missing method"


def test_missing_method_checked_after_params_type() -> None:
    # a bad params type is a decode error even when the method is also missing
    assert _decode_error('{"params":[1]}').startswith("invalid json: ")


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'[{"jsonrpc":"2.0","id":1,"method":"m"}]',
        b'[{"method":"a"},{"method":"b"}]',
        b"null",
        b"1",
        b'"method"',
        b"true",
    ],
)
def test_non_object_top_level_rejected(body: bytes) -> None:
    assert _decode_error(body).startswith("invalid json: ")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"method":"m"',
        b'{"method":"m"} trailing',
        b'{"method":"m"}{"method":"n"}',
        b"\xff\xfe",
        b'{"method":"m","id":1e400}',
        b"{'method':'m'}",
        b"[" * 5000,
    ],
)
def test_malformed_json_rejected(body: bytes) -> None:
    assert _decode_error(body).startswith("invalid json: ")


def test_lone_surrogate_str_rejected() -> None:
    assert _decode_error('{"method":"\ud800"}').startswith("invalid json: ")


# --- properties -----------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

request_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": json_values,
        "id": json_values,
        "method": st.one_of(st.text(max_size=20), json_values),
        "params": json_values,
        "Method": json_values,
        "PARAMS": json_values,
    },
)


@PROPS
@given(st.binary(max_size=200))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    try:
        req = decode_request(data)
    except DecodeError as exc:
        assert exc.message == "missing method" or exc.message.startswith("invalid json: ")
    else:
        assert isinstance(req.params, dict)
        assert req.method and req.method == req.method.strip()


@PROPS
@given(st.one_of(json_values, request_like))
def test_random_json_only_raise_decode_error(value: Any) -> None:
    data = orjson.dumps(value)
    try:
        req = decode_request(data)
    except DecodeError as exc:
        assert exc.message == "missing method" or exc.message.startswith("invalid json: ")
        return
    assert isinstance(value, dict)
    assert isinstance(req.params, dict)
    assert isinstance(req.method, str) and req.method == req.method.strip() and req.method
    if "method" in value:
        assert req.method == value["method"].strip()
    if "id" in value:
        assert req.id == value["id"]


@PROPS
@given(st.text(max_size=40), json_values, st.dictionaries(st.text(max_size=5), json_values))
def test_valid_requests_roundtrip(method: str, rid: Any, params: dict[str, Any]) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    if not method.strip():
        assert _decode_error(body) == "missing method"
        return
    req = decode_request(body)
    assert req.method == method.strip()
    assert req.id == rid
    assert req.params == params


@PROPS
@given(st.text(max_size=200))
def test_random_text_only_raises_decode_error(data: str) -> None:
    try:
        req = decode_request(data)
    except DecodeError as exc:
        assert exc.message == "missing method" or exc.message.startswith("invalid json: ")
    else:
        assert req.method


# --- envelopes ------------------------------------------------------------------------


def test_result_envelope() -> None:
    assert jsonrpc.result(1, {"ok": True}) == {"jsonrpc": "2.0", "id": 1, "result": {"ok": True}}
    assert jsonrpc.result("x", {}) == {"jsonrpc": "2.0", "id": "x", "result": {}}


def test_error_envelope_has_no_data_member() -> None:
    env = jsonrpc.error(None, jsonrpc.PARSE_ERROR, "missing method")
    assert env == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "missing method"},
    }
    assert set(env["error"]) == {"code", "message"}
    assert orjson.loads(jsonrpc.dumps(env)) == env
    assert b'"id":null' in jsonrpc.dumps(env)


def test_notification_envelope_has_no_id() -> None:
    env = jsonrpc.notification("session.update", {"seq": 1})
    assert env == {"jsonrpc": "2.0", "method": "session.update", "params": {"seq": 1}}
    assert "id" not in env


def test_dumps_is_compact_bytes() -> None:
    out = jsonrpc.dumps({"a": [1, 2], "b": None})
    assert out == b'{"a":[1,2],"b":null}'


def test_error_codes() -> None:
    assert jsonrpc.PARSE_ERROR == -32700
    assert jsonrpc.INVALID_REQUEST == -32600
    assert jsonrpc.METHOD_NOT_FOUND == -32601
    assert jsonrpc.INVALID_PARAMS == -32602
    assert jsonrpc.UNAUTHORIZED == -32001
    assert jsonrpc.ORIGIN_NOT_ALLOWED == -32003


def test_rpc_error_carries_code_and_message() -> None:
    err = jsonrpc.RpcError(-32602, "sessionId is required")
    assert err.code == -32602
    assert err.message == "sessionId is required"
    assert str(err) == "sessionId is required"


# --- nesting cap (issue 16 items 1 and 3) ---------------------------------------------


def test_nesting_measure() -> None:
    assert not jsonrpc.nesting_exceeds(1, 0)
    assert not jsonrpc.nesting_exceeds([], 1)
    assert jsonrpc.nesting_exceeds([], 0)
    assert not jsonrpc.nesting_exceeds(nested(64), 64)
    assert jsonrpc.nesting_exceeds(nested(65), 64)
    assert jsonrpc.nesting_exceeds({"a": 1, "b": [nested(64)]}, 64)
    # far past Python's recursion limit: the walk is iterative
    assert jsonrpc.nesting_exceeds([nested(900)], 64)


def test_bracket_count_bounds_the_depth() -> None:
    assert not jsonrpc.may_nest(b'{"a":[1,2,3]}', 64)
    assert jsonrpc.may_nest(nested_json(65).encode(), 64)
    assert jsonrpc.may_nest(nested_json(65), 64)


def test_id_nested_past_the_cap_is_an_invalid_request() -> None:
    raw = f'{{"jsonrpc":"2.0","id":{nested_json(255)},"method":"acp.capabilities"}}'
    with pytest.raises(DecodeError) as info:
        decode_request(raw)
    err = info.value
    assert (err.code, err.id) == (jsonrpc.INVALID_REQUEST, None)
    assert err.envelope() == jsonrpc.error(None, -32600, jsonrpc.ID_TOO_DEEP)
    assert "64" in err.message


def test_params_nested_past_the_cap_are_invalid_params_with_the_id() -> None:
    raw = f'{{"id":7,"method":"session.start","params":{{"sessionId":{nested_json(300)}}}}}'
    with pytest.raises(DecodeError) as info:
        decode_request(raw)
    assert info.value.envelope() == jsonrpc.error(7, -32602, jsonrpc.PARAMS_TOO_DEEP)


def test_nesting_up_to_the_cap_is_accepted_and_written_back() -> None:
    # params is one level itself: 63 more inside it make 64
    raw = f'{{"id":{nested_json(64)},"method":"m","params":{{"a":{nested_json(63)}}}}}'
    req = decode_request(raw)
    assert req.id == nested(64)
    orjson.dumps(jsonrpc.result(req.id, req.params))  # the reply can be encoded


def test_members_the_bridge_never_reads_are_not_measured() -> None:
    req = decode_request(f'{{"id":1,"method":"m","extra":{nested_json(500)}}}')
    assert req.id == 1


@given(depth=st.integers(min_value=0, max_value=1024), where=st.sampled_from(["id", "params"]))
@settings(max_examples=150, deadline=None)
def test_any_nesting_decodes_or_is_refused_and_the_reply_encodes(depth: int, where: str) -> None:
    if where == "id":
        raw = f'{{"id":{nested_json(depth)},"method":"m"}}'
    else:  # params itself is the first level
        raw = f'{{"id":1,"method":"m","params":{{"x":{nested_json(max(depth - 1, 0))}}}}}'
    try:
        req = decode_request(raw)
    except DecodeError as exc:
        assert depth > jsonrpc.MAX_DEPTH
        reply = exc.envelope()
    else:
        assert depth <= jsonrpc.MAX_DEPTH
        reply = jsonrpc.result(req.id, req.params)
    orjson.dumps(reply)  # whatever was accepted can be written back


def test_loads_bounded() -> None:
    assert jsonrpc.loads_bounded(nested_json(64)) == nested(64)
    with pytest.raises(ValueError, match="64 levels"):
        jsonrpc.loads_bounded(nested_json(65))
