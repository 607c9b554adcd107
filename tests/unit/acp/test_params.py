"""Params the ACP front door checks before any effect (acp/params.py)."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.acp.params import (
    absolute_cwd,
    decode_cursor,
    encode_cursor,
    list_cwd,
    mcp_servers,
    protocol_version,
    text_param,
)
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.providers.stdio.mcp import MAX_CLIENT_SERVERS


def cursor_of(value: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode()


def refused(call: Any, *args: Any) -> str:
    """The message of the ``-32602`` that ``call(*args)`` raises."""
    with pytest.raises(RpcError) as err:
        call(*args)
    assert err.value.code == INVALID_PARAMS
    return err.value.message


def test_a_text_param_is_the_stripped_string() -> None:
    assert text_param({"methodId": "  bearer \n"}, "methodId") == "bearer"


@pytest.mark.parametrize("params", [{}, {"k": None}, {"k": ""}, {"k": "  "}, {"k": 7}, {"k": []}])
def test_a_missing_empty_or_non_string_text_param_is_refused(params: dict[str, Any]) -> None:
    assert refused(text_param, params, "k") == "k is required (a non-empty string)"


def test_an_absolute_cwd_is_taken() -> None:
    assert absolute_cwd({"cwd": " /srv/work "}) == "/srv/work"


def test_a_relative_cwd_is_refused() -> None:
    assert refused(absolute_cwd, {"cwd": "work/x"}) == "cwd must be an absolute path, got 'work/x'"


@pytest.mark.parametrize("params", [{}, {"cwd": ""}, {"cwd": 3}])
def test_a_missing_cwd_is_refused(params: dict[str, Any]) -> None:
    assert refused(absolute_cwd, params) == "cwd is required (a non-empty string)"


def test_a_cwd_with_a_nul_is_refused_at_session_new() -> None:
    assert "NUL" in refused(absolute_cwd, {"cwd": "/srv/work\0/x"})


@pytest.mark.parametrize("params", [{}, {"cwd": None}, {"cwd": "/srv/work"}])
def test_the_list_filter_cwd_is_absent_or_absolute(params: dict[str, Any]) -> None:
    assert list_cwd(params) == params.get("cwd")


@pytest.mark.parametrize("cwd", ["work", "", 7, ["/srv"]])
def test_a_list_filter_cwd_not_absolute_is_refused(cwd: object) -> None:
    assert refused(list_cwd, {"cwd": cwd}) == "cwd must be an absolute path"


def test_mcp_servers_absent_are_none() -> None:
    assert mcp_servers({}) == [] and mcp_servers({"mcpServers": None}) == []


def test_mcp_servers_are_validated_and_cleaned() -> None:
    given_servers = [
        {"name": "fs", "command": "mcp-fs", "args": ["-v"], "env": [], "extra": 1},
        {"type": "http", "name": "web", "url": "https://mcp.example/x"},
    ]
    assert mcp_servers({"mcpServers": given_servers}) == [
        {"name": "fs", "command": "mcp-fs", "args": ["-v"], "env": []},
        {"type": "http", "name": "web", "url": "https://mcp.example/x", "headers": []},
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "fs"}, "mcpServers must be a list"),
        ([{"command": "x"}], "mcpServers[0]: an object with a name is required"),
        ([{"name": "fs"}], "mcpServers[0].command: required for a stdio server"),
        ([{"name": "w", "type": "http", "url": "ftp://x"}], "mcpServers[0].url: an http(s) URL"),
        ([{"name": "fs", "command": "c"}] * (MAX_CLIENT_SERVERS + 1), "mcpServers: at most"),
    ],
)
def test_malformed_mcp_servers_are_refused(value: object, message: str) -> None:
    assert refused(mcp_servers, {"mcpServers": value}).startswith(message)


@pytest.mark.parametrize(("version", "taken"), [(1, 1), (0, 0), (7, 7), ("2025-01-01", 0)])
def test_a_protocol_version_is_an_integer_or_a_legacy_string(version: object, taken: int) -> None:
    assert protocol_version({"protocolVersion": version}) == taken


@pytest.mark.parametrize("params", [{}, *({"protocolVersion": v} for v in (None, -1, 1.0, True))])
def test_a_missing_or_non_integer_protocol_version_is_refused(params: dict[str, Any]) -> None:
    assert refused(protocol_version, params) == "protocolVersion is required (an integer)"


def test_a_cursor_round_trips() -> None:
    assert decode_cursor(encode_cursor(12.5, "s1")) == (12.5, "s1")
    assert decode_cursor(None) is None


@given(st.floats(allow_nan=False, allow_infinity=False), st.text())
def test_any_cursor_written_reads_back(updated_at: float, session_id: str) -> None:
    assert decode_cursor(encode_cursor(updated_at, session_id)) == (updated_at, session_id)


@pytest.mark.parametrize(
    "value",
    [["nan", "x"], [True, "x"], [1.0, 7], [1.0, None], [None, "x"], ["inf", "x"], "x", [1.0]],
)
def test_a_cursor_of_the_wrong_shape_is_invalid_params(value: object) -> None:
    assert refused(decode_cursor, cursor_of(value)) == "invalid cursor"


@pytest.mark.parametrize("cursor", ["not base64!", "e30", 7, cursor_of([1.0, "a", "b"])])
def test_a_cursor_the_bridge_did_not_write_is_invalid_params(cursor: object) -> None:
    assert refused(decode_cursor, cursor) == "invalid cursor"
