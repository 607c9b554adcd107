"""The spec's lenient value-coercion rules (spec README, "Input value coercion").

Pure functions; every parameter read from the wire goes through one of these.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import orjson

from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_LEADING_INT = re.compile(r"^\s*[+-]?[0-9]+")  # not \d: it also matches "١٢"


def _number_text(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value) and value == int(value) and abs(value) < 1e21:
        # the shortest round-trip digits, not the exact binary value:
        # 1.2345678901234567e19 renders as 12345678901234567000, not …567168
        return format(Decimal(repr(value)).to_integral_value(), "f") if value else "0"
    text = repr(value)
    # Go's shortest form writes exponents as e+21 / e-07.
    if "e" in text:
        mantissa, _, exp = text.partition("e")
        sign = "-" if exp.startswith("-") else "+"
        digits = exp.lstrip("+-").rjust(2, "0")
        text = f"{mantissa}e{sign}{digits}"
    return text


def text(value: Any, default: str = "") -> str:
    """**text**: strings trimmed; numbers/bools rendered; blank → default."""
    if type(value) is str:  # the common case first: one check, one strip
        out = value.strip()
        return out if out else default
    if value is None:
        return default
    if isinstance(value, bool):
        out = "true" if value else "false"
    elif isinstance(value, str):
        out = value
    elif isinstance(value, (int, float)):
        out = _number_text(value)
    else:
        try:
            out = orjson.dumps(value).decode()
        except TypeError:  # nested deeper than orjson writes (input is capped far below)
            return default
    out = out.strip()
    return out if out else default


def path_text(value: Any, name: str) -> str:
    """**text** for a filesystem path: a NUL character (which no path can hold, and
    which the OS calls refuse with an exception) is ``-32602`` naming the param."""
    out = text(value)
    if "\0" in out:
        raise RpcError(INVALID_PARAMS, f"{name} must not contain a NUL character")
    return out


def flag(value: Any, default: bool) -> bool:
    """**flag**: 1/true/yes/on and 0/false/no/off, else the default."""
    word = text(value).lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    return default


_FRAME_TRUE = frozenset({"true", "1", "yes"})


def frame_bool(value: Any) -> bool:
    """**frame bool**: bools as-is, numbers non-zero, strings only ``true``/``1``/``yes``
    (any case); anything else false. Gateway frames and skill-command output."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        return value.strip().lower() in _FRAME_TRUE
    return False


def loose_bool(value: Any) -> bool:
    """**loose bool**: bools as-is, strings via flag (default false), numbers non-zero."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return flag(value, False)
    if isinstance(value, (int, float)):
        return value != 0
    return False


def positive_int(value: Any, default: int = 0) -> int:
    """**positive int**: number > 0 (truncated) or a string with a leading integer > 0."""
    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return default
        n = int(value)
        return n if n > 0 else default
    if isinstance(value, str):
        m = _LEADING_INT.match(value)
        if m:
            signed = m.group(0).strip()
            digits = signed.lstrip("+-").lstrip("0")
            # past 64 bits it is not a readable count (and int() of over 4,300 digits
            # raises): the default, as for a number that does not fit
            if signed.startswith("-") or not digits or len(digits) > 19:
                return default
            n = int(digits)
            return n if n < 2**63 else default
    return default


def string_list(value: Any) -> list[str] | None:
    """**string list**: array elements through text, blanks dropped; non-array → None."""
    if not isinstance(value, list):
        return None
    out = [text(v) for v in value]
    return [v for v in out if v]


def env_text(env: dict[str, str] | Any, name: str) -> str:
    """Environment rule: trimmed; blank means unset."""
    raw = env.get(name)
    return raw.strip() if isinstance(raw, str) else ""
