"""Deeply nested JSON for the robustness tests (issue 16): built iteratively, so the
depth is not limited by Python's recursion limit."""

from __future__ import annotations

from typing import Any


def nested(depth: int, leaf: Any = 1) -> Any:
    """``depth`` levels of containers (lists and objects alternating) around ``leaf``."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def nested_json(depth: int, leaf: str = "1") -> str:
    """The JSON text of :func:`nested` (no encoder involved: orjson writes 254 levels)."""
    opens = "".join('{"k":' if i % 2 == 0 else "[" for i in reversed(range(depth)))
    closes = "".join("}" if i % 2 == 0 else "]" for i in range(depth))
    return opens + leaf + closes
