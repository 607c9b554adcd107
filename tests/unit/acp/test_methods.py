"""Params the ACP front door checks before any effect (acp/methods.py)."""

from __future__ import annotations

import base64

import orjson
import pytest

from xwm_bridge.acp.methods import _cwd, decode_cursor, encode_cursor
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError


def cursor_of(value: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode()


def test_a_cursor_round_trips() -> None:
    assert decode_cursor(encode_cursor(12.5, "s1")) == (12.5, "s1")
    assert decode_cursor(None) is None


@pytest.mark.parametrize(
    "value",
    [["nan", "x"], [True, "x"], [1.0, 7], [1.0, None], [None, "x"], ["inf", "x"], "x", [1.0]],
)
def test_a_cursor_of_the_wrong_shape_is_invalid_params(value: object) -> None:
    with pytest.raises(RpcError) as err:
        decode_cursor(cursor_of(value))
    assert (err.value.code, err.value.message) == (INVALID_PARAMS, "invalid cursor")


def test_a_cwd_with_a_nul_is_refused_at_session_new() -> None:
    with pytest.raises(RpcError) as err:
        _cwd({"cwd": "/srv/work\0/x"})
    assert err.value.code == INVALID_PARAMS and "NUL" in err.value.message
