"""The numeric params of ``bridge.watch`` and ``session.list``: finite, bounded, and a
clean -32602 otherwise (never a traceback, never a watch without an end)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from xwm_bridge.app.operator import (
    DEFAULT_WATCH_SECONDS,
    MAX_BATCH,
    MAX_PAGE,
    MAX_WAIT_MS,
    MAX_WATCH_SECONDS,
    WatchParams,
    parse_session_query,
)
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

BAD = [math.nan, math.inf, -math.inf, True, False, "60", [], {}, -1, 10**400]
BAD_IDS = ["nan", "inf", "-inf", "true", "false", "str", "list", "dict", "-1", "int-past-float"]


@pytest.mark.parametrize(
    ("sent", "seconds"),
    [
        (None, DEFAULT_WATCH_SECONDS),
        (0.1, 0.1),
        (30, 30.0),
        (MAX_WATCH_SECONDS, MAX_WATCH_SECONDS),
        (MAX_WATCH_SECONDS + 1, MAX_WATCH_SECONDS),
        (1e300, MAX_WATCH_SECONDS),
        (10**30, MAX_WATCH_SECONDS),
    ],
)
def test_max_seconds_is_clamped(sent: Any, seconds: float) -> None:
    params = {} if sent is None else {"maxSeconds": sent}
    assert WatchParams.parse(params).max_seconds == seconds


def test_the_streaming_bound_is_documented_as_the_default() -> None:
    assert MAX_WATCH_SECONDS == DEFAULT_WATCH_SECONDS == 3600.0


@pytest.mark.parametrize("key", ["maxSeconds", "waitMs", "maxEvents"])
@pytest.mark.parametrize("value", [*BAD, -0.5], ids=[*BAD_IDS, "-0.5"])
def test_bad_watch_numbers_are_invalid_params(key: str, value: Any) -> None:
    with pytest.raises(RpcError) as info:
        WatchParams.parse({key: value})
    assert info.value.code == INVALID_PARAMS
    assert key in info.value.message


def test_huge_watch_numbers_are_clamped() -> None:
    wp = WatchParams.parse({"waitMs": 1e300, "maxEvents": 1e300})
    assert wp.wait_s == MAX_WAIT_MS / 1000 and wp.max_events == MAX_BATCH


@pytest.mark.parametrize("key", ["limit", "updatedSince"])
@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
def test_bad_list_numbers_are_invalid_params(key: str, value: Any) -> None:
    with pytest.raises(RpcError) as info:
        parse_session_query({key: value})
    assert info.value.code == INVALID_PARAMS


def test_a_huge_list_limit_is_clamped() -> None:
    assert parse_session_query({"limit": 1e300}).limit == MAX_PAGE
