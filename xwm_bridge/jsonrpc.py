"""Sans-I/O JSON-RPC 2.0 envelopes as the bridge speaks them (contract.md §8).

Decoding never raises anything but :class:`DecodeError`; encoders return bytes.

Nesting is capped on input (:data:`MAX_DEPTH` levels for an ``id``, the
``params`` and every peer's reply): orjson reads 1024 levels but writes only
254, so a value the bridge accepted deeper than that could not be written back
to a client, a log line or the session store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import orjson

# Error codes (contract.md §10, plus the additive codes of this implementation).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
UNAUTHORIZED: Final = -32001
QUEUE_FULL: Final = -32004
ORIGIN_NOT_ALLOWED: Final = -32003
SHUTTING_DOWN: Final = -32005
#: a session owned by another principal (the same code as an origin refusal)
FORBIDDEN: Final = -32003

MISSING_METHOD: Final = "missing method"
#: deepest nesting accepted in an ``id``, the ``params`` or a peer's result (a scalar
#: is 0 levels, ``[]`` one); far below the 254 levels orjson can write back.
MAX_DEPTH: Final = 64
ID_TOO_DEEP: Final = f"invalid request: id nested deeper than {MAX_DEPTH} levels"
PARAMS_TOO_DEEP: Final = f"invalid params: nested deeper than {MAX_DEPTH} levels"


class DecodeError(Exception):
    """A frame that is not a valid request; ``message`` is the wire text, ``code`` the
    error code (``-32700`` unless the JSON was fine and the envelope was not) and
    ``id`` the request id to answer with, when it could be read."""

    def __init__(self, message: str, code: int = PARSE_ERROR, rid: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.id = rid

    def envelope(self) -> dict[str, Any]:
        return error(self.id, self.code, self.message)


def nesting_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when ``value`` holds containers nested more than ``limit`` levels deep.

    Iterative (no recursion limit to hit), and it only visits containers."""
    if not isinstance(value, (dict, list)):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def may_nest(data: bytes | str, limit: int) -> bool:
    """False when ``data`` cannot hold more than ``limit`` levels: it has at most
    ``limit`` opening brackets (a C-speed count that spares most frames the walk)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") > limit
    return data.count(b"[") + data.count(b"{") > limit


def loads_bounded(data: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """``orjson.loads`` that also refuses nesting deeper than ``limit`` (a
    :class:`ValueError` naming the limit; ``orjson.JSONDecodeError`` for bad JSON)."""
    obj = orjson.loads(data)
    if may_nest(data, limit) and nesting_exceeds(obj, limit):
        raise ValueError(f"nested deeper than {limit} levels")
    return obj


class RpcError(Exception):
    """A method-level error answered as a JSON-RPC error envelope."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    #: not in a repr: params carry credentials (tokens, passwords, API keys)
    params: dict[str, Any] = field(default_factory=dict, repr=False)
    id: Any = None
    #: ``False``: a request even with ``id`` null (the frame had an ``id`` member, as
    #: JSON-RPC 2.0 and ACP v1 allow); ``None``: a null ``id`` means a notification
    notification: bool | None = field(default=None, compare=False)

    @property
    def is_notification(self) -> bool:
        return self.id is None if self.notification is None else self.notification


def member(obj: dict[str, Any], name: str) -> tuple[bool, Any]:
    """Exact name first, then a case-insensitive match (the original matched both)."""
    if name in obj:
        return True, obj[name]
    for key, value in obj.items():
        if key.lower() == name:
            return True, value
    return False, None


def decode_request(data: bytes | str) -> Request:
    """Decode one request frame or raise :class:`DecodeError` with the spec's message."""
    return request_from(parse(data), data)


def parse(data: bytes | str) -> Any:
    """The frame's JSON value, or :class:`DecodeError` (``-32700 invalid json: …``)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"invalid json: {exc}") from None


def request_from(obj: Any, data: bytes | str) -> Request:
    """The request in ``obj``, the value :func:`parse` read from ``data`` (whose text
    spares most frames the nesting walk), or :class:`DecodeError`."""
    if not isinstance(obj, dict):
        raise DecodeError(f"invalid json: expected a JSON object, got {_json_type(obj)}")
    # member()'s exact name first, inline: the names of nearly every frame
    method = obj["method"] if "method" in obj else member(obj, "method")[1]
    if method is not None and not isinstance(method, str):
        raise DecodeError(f"invalid json: method must be a string, got {_json_type(method)}")
    params = obj["params"] if "params" in obj else member(obj, "params")[1]
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise DecodeError(f"invalid json: params must be an object, got {_json_type(params)}")
    rid = obj["id"] if "id" in obj else member(obj, "id")[1]
    if may_nest(data, MAX_DEPTH):
        if nesting_exceeds(rid, MAX_DEPTH):
            raise DecodeError(ID_TOO_DEEP, INVALID_REQUEST)
        if nesting_exceeds(params, MAX_DEPTH):
            raise DecodeError(PARAMS_TOO_DEEP, INVALID_PARAMS, rid)
    method_name = (method or "").strip()
    if not method_name:
        raise DecodeError(MISSING_METHOD)
    return Request(method=method_name, params=params, id=rid)


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if value is None:
        return "null"
    return "object"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps_line(obj: Any) -> bytes:
    """One newline-terminated frame (stdio framing)."""
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def request(rid: Any, method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def result(rid: Any, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": value}


def error(rid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}
