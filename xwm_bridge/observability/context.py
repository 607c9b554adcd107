"""Per-request and per-turn ids carried by contextvars onto every log line."""

from __future__ import annotations

import itertools
import os
from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="")
turn_id: ContextVar[str] = ContextVar("turn_id", default="")

_prefix = os.urandom(3).hex()
_counter = itertools.count(1)


def new_request_id() -> str:
    """Short, unique within the process, unguessable across restarts."""
    return f"r-{_prefix}-{next(_counter)}"
