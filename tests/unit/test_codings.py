"""codings.transfer_refusal: the one decision on a Transfer-Encoding (RFC 9112 §6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.codings import announced, transfer_refusal


@pytest.mark.parametrize(
    ("value", "status"),
    [
        ("chunked", 0),
        ("CHUNKED", 0),
        (" chunked\t", 0),
        (", chunked", 0),  # empty list elements are ignored (RFC 9110 §5.6.1)
        ("gzip, chunked", 501),
        ("deflate,chunked", 501),
        ("identity, chunked", 501),
        ("x;q=1, chunked", 501),
        ("gzip", 400),  # chunked is not final: the length cannot be known
        ("identity", 400),
        ("chunked, identity", 400),
        ("chunked, chunked", 400),  # applied twice (§6.1)
        ("chunked;a=b", 400),
        ("", 400),
        (" , ", 400),
    ],
)
def test_transfer_refusal(value: str, status: int) -> None:
    assert transfer_refusal(value) == status


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (None, -1),
        ("12", 12),
        (" 12\t", 12),
        ("0", 0),
        ("000", 0),
        ("0" * 5000 + "7", 7),  # int() refuses more than 4300 digits
        ("1" * 21, -1),
        ("+1", -1),
        ("1 2", -1),
        ("\u00b2", -1),  # a digit to str.isdigit, not to int()
        ("", -1),
    ],
)
def test_announced(value: str | None, size: int) -> None:
    assert announced(value) == size


def _announced_reference(length: str | None) -> int:
    """The straightforward reading (:func:`announced` before its plain-number fast path)."""
    text = "" if length is None else length.strip(" \t")
    digits = text.lstrip("0") or text[-1:]
    if not digits.isascii() or not digits.isdigit() or len(digits) > 20:
        return -1
    return int(digits)


@given(
    st.one_of(
        st.none(),
        st.text(alphabet="0123456789 \t+-\u00b2\u0661x", max_size=30),
        st.integers(min_value=0, max_value=2**70).map(str),
        st.builds(lambda z, n: "0" * z + str(n), st.integers(0, 30), st.integers(0, 2**66)),
    )
)
def test_announced_equals_the_straightforward_reading(value: str | None) -> None:
    assert announced(value) == _announced_reference(value)


def _refusal_reference(value: str) -> int:
    """The straightforward decision (:func:`transfer_refusal` before its fast path)."""
    codings = [c for c in (part.strip(" \t").lower() for part in value.split(",")) if c]
    if codings == ["chunked"]:
        return 0
    if not codings or codings[-1] != "chunked" or codings.count("chunked") > 1:
        return 400
    return 501


@given(
    st.lists(
        st.sampled_from(["chunked", "Chunked", "gzip", "", " ", "\t", "x;q=1"]), max_size=4
    ).map(",".join)
    | st.text(alphabet="chunkedCHUNKED ,\tgz", max_size=16)
)
def test_transfer_refusal_equals_the_straightforward_decision(value: str) -> None:
    assert transfer_refusal(value) == _refusal_reference(value)
