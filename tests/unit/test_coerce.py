"""xwm_bridge.coerce: the spec's lenient value-coercion rules (README, "Input value coercion")."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge import coerce

PROPS = settings(max_examples=200, deadline=None)


# --- text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("abc", "abc"),
        ("  padded\t\n", "padded"),
        ("inner  space", "inner  space"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (42, "42"),
        (-7, "-7"),
        (2**70, "1180591620717411303424"),
        (1.5, "1.5"),
        (-0.25, "-0.25"),
        (0.1, "0.1"),
        (100.0, "100"),
        (-3.0, "-3"),
        (0.0, "0"),
        (-0.0, "0"),
        (1e20, "100000000000000000000"),
        (12345678901234567890.0, "12345678901234567000"),
        (1e21, "1e+21"),
        (-1e21, "-1e+21"),
        (1.5e300, "1.5e+300"),
        (1e100, "1e+100"),
        (1e-7, "1e-07"),
        (2.5e-10, "2.5e-10"),
    ],
)
def test_text_renders(value: Any, expected: str) -> None:
    assert coerce.text(value) == expected


def test_text_of_json_decoded_numbers() -> None:
    decoded = orjson.loads(b"[1e21, 1E+21, 1.0, 10, 0.5]")
    assert [coerce.text(v) for v in decoded] == ["1e+21", "1e+21", "1", "10", "0.5"]


@pytest.mark.parametrize("value", [None, "", "   ", "\n\t"])
def test_text_blank_gives_default(value: Any) -> None:
    assert coerce.text(value) == ""
    assert coerce.text(value, "fallback") == "fallback"


def test_text_default_not_used_for_non_blank() -> None:
    assert coerce.text("0", "d") == "0"
    assert coerce.text(False, "d") == "false"
    assert coerce.text(0, "d") == "0"


def test_text_of_containers_is_a_dump() -> None:
    assert coerce.text({"a": 1}) == '{"a":1}'
    assert coerce.text([1, "x"]) == '[1,"x"]'
    assert coerce.text([]) == "[]"


@PROPS
@given(st.text())
def test_text_of_string_is_trimmed_string(value: str) -> None:
    assert coerce.text(value, "D") == (value.strip() or "D")


@PROPS
@given(st.integers())
def test_text_of_int_is_decimal(value: int) -> None:
    assert coerce.text(value) == str(value)


@PROPS
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_text_of_float_round_trips(value: float) -> None:
    out = coerce.text(value)
    assert float(out) == value
    assert out == out.strip() and out
    assert "E" not in out
    if "e" in out:
        _, exp = out.split("e")
        assert exp[0] in "+-" and len(exp) >= 3
    assert not out.endswith(".0")


# --- flag -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["1", "true", "TRUE", " yes ", "On", "oN", True, 1, 1.0, " True\n"]
)
def test_flag_true_words(value: Any) -> None:
    assert coerce.flag(value, False) is True


@pytest.mark.parametrize("value", ["0", "false", "FALSE", " no", "off", "Off", False, 0, 0.0])
def test_flag_false_words(value: Any) -> None:
    assert coerce.flag(value, True) is False


@pytest.mark.parametrize("value", [None, "", " ", "maybe", "2", "y", "n", "t", 2, -1, [], {}])
def test_flag_other_gives_default(value: Any) -> None:
    assert coerce.flag(value, True) is True
    assert coerce.flag(value, False) is False


# --- loose bool -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        ("true", True),
        (" YES ", True),
        ("on", True),
        ("1", True),
        ("false", False),
        ("maybe", False),
        ("", False),
        ("2", False),
        (1, True),
        (-1, True),
        (0.5, True),
        (0, False),
        (0.0, False),
        (None, False),
        ([], False),
        ([1], False),
        ({"a": 1}, False),
    ],
)
def test_loose_bool(value: Any, expected: bool) -> None:
    assert coerce.loose_bool(value) is expected


# --- positive int ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        (2.9, 2),
        (1.0, 1),
        (0.5, 0),
        (0, 0),
        (-3, 0),
        ("12", 12),
        (" 12abc", 12),
        ("+3", 3),
        ("007", 7),
        ("1e3", 1),
        ("0x10", 0),
        ("-3", 0),
        ("0", 0),
        ("abc", 0),
        ("", 0),
        (None, 0),
        (True, 0),
        (False, 0),
        (float("inf"), 0),
        (float("nan"), 0),
        ([3], 0),
    ],
)
def test_positive_int(value: Any, expected: int) -> None:
    assert coerce.positive_int(value) == expected


def test_positive_int_default() -> None:
    assert coerce.positive_int(None, 15) == 15
    assert coerce.positive_int(-1, 15) == 15
    assert coerce.positive_int("x", 15) == 15
    assert coerce.positive_int(True, 15) == 15
    assert coerce.positive_int(3, 15) == 3
    assert coerce.positive_int("4", 15) == 4


def test_positive_int_of_a_string_past_64_bits_is_the_default() -> None:
    """A client's ``"timeoutMs": "999…"`` (5,000 digits) raised ValueError (CPython's
    4,300-digit limit) out of the method: -32603 and a traceback. Like a number that
    does not fit 64 bits, it is not a readable positive int."""
    assert coerce.positive_int("9" * 5000, 15) == 15
    assert coerce.positive_int("9" * 19, 15) == 15
    assert coerce.positive_int("9" * 18, 15) == 10**18 - 1
    assert coerce.positive_int(" 12abc", 15) == 12


# --- string list ----------------------------------------------------------------------


def test_string_list_converts_and_drops_blanks() -> None:
    assert coerce.string_list([" a ", "", None, 1, True, "  ", 2.5]) == ["a", "1", "true", "2.5"]


def test_string_list_keeps_duplicates_and_order() -> None:
    assert coerce.string_list(["b", "a", "b"]) == ["b", "a", "b"]


def test_string_list_empty_array() -> None:
    assert coerce.string_list([]) == []


@pytest.mark.parametrize("value", [None, "a,b", {"a": 1}, 3, True])
def test_string_list_non_array_is_not_given(value: Any) -> None:
    assert coerce.string_list(value) is None


# --- env_text -------------------------------------------------------------------------


def test_env_text() -> None:
    env = {"A": "  v  ", "B": "   ", "C": ""}
    assert coerce.env_text(env, "A") == "v"
    assert coerce.env_text(env, "B") == ""
    assert coerce.env_text(env, "C") == ""
    assert coerce.env_text(env, "MISSING") == ""


def test_path_text_refuses_nul() -> None:
    """issue 16 item 4: a NUL reached os calls and came back as -32603."""
    import pytest

    from xwm_bridge.jsonrpc import RpcError

    assert coerce.path_text(" /tmp/x ", "workingDirectory") == "/tmp/x"
    with pytest.raises(RpcError) as info:
        coerce.path_text("/tmp/a\0b", "workingDirectory")
    assert info.value.code == -32602 and "workingDirectory" in info.value.message


def test_text_of_a_value_too_deep_to_encode_is_the_default() -> None:
    from tests.nesting import nested

    assert coerce.text(nested(300), "dflt") == "dflt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True), (False, False), (1, True), (-3, True), (0.5, True), (0, False),
        (0.0, False), ("true", True), (" TRUE ", True), ("1", True), ("Yes", True),
        ("on", False), ("y", False), ("false", False), ("", False), (None, False),
        ([1], False), ({"a": 1}, False),
    ],
)  # fmt: skip
def test_frame_bool(value: Any, expected: bool) -> None:
    """**frame bool** (spec README): gateway frames and skill-command output."""
    assert coerce.frame_bool(value) is expected
