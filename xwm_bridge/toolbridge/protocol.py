"""Sans-I/O MCP server protocol (adapters.md §2): frame decoding (JSON-RPC batches
included), version negotiation, tool list, call params.

The server loop (``server.py``) decodes frames and runs tools; every decision
about what goes on the wire is made here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import orjson

from xwm_bridge import jsonrpc
from xwm_bridge.framing import FramingError, head_request_id
from xwm_bridge.jsonrpc import DecodeError, RpcError

#: protocol revisions negotiable through ``initialize``, oldest to newest.
SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
#: the revisions whose peers may send JSON-RPC batches. 2025-03-26 alone: it added
#: batching ("MUST support receiving JSON-RPC batches"), 2024-11-05's schema has no
#: array message and 2025-06-18 removed batching again.
BATCH_VERSIONS = frozenset({"2025-03-26"})
SERVER_INFO = {"name": "xworkmate-go-core", "version": "0.2.0"}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "chat",
        "description": "OpenAI-compatible reviewer chat bridge",
        "inputSchema": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string"},
                "model": {"type": "string"},
                "system": {"type": "string"},
            },
            "required": ["prompt"],
        },
    },
    {
        "name": "claude_review",
        "description": "Review-only bridge over Claude CLI",
        "inputSchema": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string"},
                "model": {"type": "string"},
                "system": {"type": "string"},
                "tools": {"type": "string"},
            },
            "required": ["prompt"],
        },
    },
    {
        "name": "vault_kv",
        "description": "HashiCorp Vault K/V v2 bridge",
        "inputSchema": {
            "type": "object",
            "properties": {
                "operation": {"type": "string"},
                "mount": {"type": "string"},
                "path": {"type": "string"},
                "data": {"type": "object"},
                "cas": {"type": "number"},
            },
            "required": ["operation", "path"],
        },
    },
]
TOOL_NAMES = frozenset(t["name"] for t in TOOLS)
NULL_ID = "invalid request: id must not be null"
BAD_ID = "invalid request: id must be a string or a number"
EMPTY_BATCH = "invalid request: empty batch"
BATCH_BEFORE_INITIALIZE = "invalid request: batches are not supported before initialize"
#: a request whose id is that of a request still in flight (MCP: an id MUST NOT have
#: been used before in the session); answered with that id, never run
ID_IN_USE = "invalid request: request id already in use"
INITIALIZE_IN_BATCH = "invalid request: initialize must not be part of a JSON-RPC batch"
Message = jsonrpc.Request | dict[str, Any] | None
#: the integers orjson reads (and writes) as integers: [-2**63, 2**64); it reads one
#: outside as a float, and refuses to write one
INT_MIN, INT_END = -(2**63), 2**64


@dataclass(frozen=True, slots=True)
class Batch:
    """A frame holding a JSON array: a JSON-RPC batch, served or refused by the
    server according to the negotiated version (:func:`batch_refusal`)."""

    elements: tuple[Any, ...]
    #: the frame's text (spares most elements the nesting walk, as for a frame)
    data: bytes


def decode(item: bytes | FramingError) -> Message | Batch:
    """One frame → the request to serve, the error envelope to answer it with,
    ``None`` for a response, which is never answered, or a :class:`Batch`.

    The contract's decoding (``jsonrpc.request_from``: ``-32700`` for bad framing,
    JSON or field types), with MCP's rules on top:

    * a request's id MUST NOT be null, so ``"id": null`` is neither a request nor a
      notification (which has no id member) but an Invalid Request, answered
      ``-32600`` with id null (JSON-RPC 2.0) and never run. It was served as a
      notification: the method ran and the client waited for an answer for ever;
    * an id that is not a string or a number (a boolean, an object, an array) is an
      Invalid Request too (JSON-RPC 2.0; MCP: a string or an integer), answered
      ``-32600`` with id null and never run. It ran, with a tool call no
      ``notifications/cancelled`` could name, and was answered with that id;
    * a JSON-RPC response (no ``method``; a ``result`` or an ``error``) answers a
      request of ours, and the toolbridge sends none: it is dropped, as MCP SDKs drop
      a response to an unknown id. It was answered ``-32700 missing method``, an error
      in reply to a reply (with id null, which a peer answering errors could loop on);
    * a request refused by the contract's decoding (``params`` not an object, a
      ``method`` missing or not a string) whose id could be read is answered with
      that id (JSON-RPC 2.0: id null only when it could not be read). It was
      answered with id null, so the request itself was never answered;
    * a frame too large to read (``limits.max_body_bytes``) keeps the contract's
      ``-32700 message too large`` but is answered with its id when its first bytes
      hold a string or number id and a method (``framing.head_request_id``). It was
      answered with id null, so the client waited for the request's answer for ever;
    * a JSON array is a :class:`Batch`, whose elements :func:`batch_messages`
      decodes by these rules once :func:`batch_refusal` lets it through. It was
      ``-32700 invalid json: expected a JSON object, got array``."""
    if isinstance(item, FramingError):
        rid = head_request_id(item.head)
        return jsonrpc.error(rid if _scalar_id(rid) else None, jsonrpc.PARSE_ERROR, item.message)
    try:
        obj = jsonrpc.parse(item)
    except DecodeError as exc:
        return exc.envelope()
    if _lossy_ids(obj):
        obj = _exact(item, obj)
    if isinstance(obj, list):
        return Batch(tuple(obj), item)
    return _message(obj, item)


def _message(obj: Any, item: bytes) -> Message:
    rid = None
    if isinstance(obj, dict):
        has_id, rid = jsonrpc.member(obj, "id")
        has_method, method = jsonrpc.member(obj, "method")
        if not has_method and (jsonrpc.member(obj, "result")[0] or jsonrpc.member(obj, "error")[0]):
            return None
        if has_id and rid is None and method is not None:
            return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, NULL_ID)
        if rid is not None and not _scalar_id(rid):
            return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, BAD_ID)
    try:
        req = jsonrpc.request_from(obj, item)
    except DecodeError as exc:
        if exc.id is None and _scalar_id(rid):
            return jsonrpc.error(rid, exc.code, exc.message)
        return exc.envelope()
    # adapters.md §2.1 (and MCP): method names are matched exactly. The contract's
    # decoding trims them (a blank one stays ``missing method``), so `` ping`` was
    # served as ``ping`` and ``notifications/cancelled `` cancelled.
    method = jsonrpc.member(obj, "method")[1]
    return req if method == req.method else replace(req, method=method)


def _lossy(value: Any) -> bool:
    """A float that may be an integer orjson could not read as one (outside
    [-2**63, 2**64); -2**63 - 1 rounds to the float -2**63, hence the bound
    included); a fraction such as ``1.5`` is not."""
    return isinstance(value, float) and value.is_integer() and not INT_MIN < value < INT_END


def _lossy_ids(obj: Any) -> bool:
    """Whether a message in ``obj`` (a frame's value, or a batch) has an id, or a
    cancel a ``requestId``, that orjson may have rounded to a float."""
    for message in obj if isinstance(obj, list) else (obj,):
        if isinstance(message, dict):
            if _lossy(jsonrpc.member(message, "id")[1]):
                return True
            params = jsonrpc.member(message, "params")[1]
            if isinstance(params, dict) and _lossy(params.get("requestId")):
                return True
    return False


def _exact(item: bytes, obj: Any) -> Any:
    """``item`` read again by the standard library, which keeps integers of any size
    exact (orjson read 2**64 as ``1.8446744073709552e19``, so the id was answered as
    another number, and a cancel naming it reached nothing). Only for the rare frame
    :func:`_lossy_ids` flags; when it cannot (more digits than Python converts,
    nesting past its recursion limit) orjson's reading stands."""
    try:
        return json.loads(item)
    except (ValueError, RecursionError):
        return obj


def wire_ids(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with an integer id orjson cannot write (outside [-2**63, 2**64))
    as its exact digits (an ``orjson.Fragment``), so every answer carries its
    request's id as it was sent."""
    rid = message.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool) and not INT_MIN <= rid < INT_END:
        return {**message, "id": orjson.Fragment(str(rid).encode())}
    return message


def batch_refusal(batch: Batch, version: str | None, limit: int) -> dict[str, Any] | None:
    """The one error (id null) answering a whole batch, or ``None`` to serve it.

    ``version`` is the one this connection's ``initialize`` negotiated (``None``
    before it: initialize MUST NOT be part of a batch and nothing else may come
    first). Outside :data:`BATCH_VERSIONS` a batch is refused, ``-32600`` naming the
    version (it was ``-32700 invalid json``, as if the JSON were broken). Served, an
    empty batch is one ``-32600`` (JSON-RPC 2.0), and one of more than ``limit``
    messages is refused whole, so that no frame starts unbounded work."""
    if version is None:
        return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, BATCH_BEFORE_INITIALIZE)
    if version not in BATCH_VERSIONS:
        message = f"invalid request: batches are not supported in protocol version {version}"
        return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, message)
    if not batch.elements:
        return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, EMPTY_BATCH)
    if len(batch.elements) > limit:
        message = (
            f"invalid request: a batch of {len(batch.elements)} messages"
            f" exceeds the limit of {limit}"
        )
        return jsonrpc.error(None, jsonrpc.INVALID_REQUEST, message)
    return None


def batch_messages(batch: Batch) -> list[Message]:
    """Each element of a served batch decoded as a frame of its own would be (its id
    rules included), except that an element that is not an object is ``-32600``
    (JSON-RPC 2.0: the JSON parsed, the element is no Request) and an ``initialize``
    request is refused, ``-32600`` with its id (MCP: it MUST NOT be part of a batch;
    the negotiated version cannot change inside one)."""
    out: list[Message] = []
    for obj in batch.elements:
        if not isinstance(obj, dict):
            message = f"invalid request: expected a JSON object, got {_kind(obj)}"
            out.append(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, message))
            continue
        decoded = _message(obj, batch.data)
        if (
            isinstance(decoded, jsonrpc.Request)
            and decoded.method == "initialize"
            and not decoded.is_notification
        ):
            decoded = jsonrpc.error(decoded.id, jsonrpc.INVALID_REQUEST, INITIALIZE_IN_BATCH)
        out.append(decoded)
    return out


def _scalar_id(rid: Any) -> bool:
    return isinstance(rid, (str, int, float)) and not isinstance(rid, bool)


def negotiate(params: dict[str, Any]) -> str:
    """The client's version when we speak it, else our latest (the client decides)."""
    requested = params.get("protocolVersion")
    if isinstance(requested, str) and requested in SUPPORTED_VERSIONS:
        return requested
    return LATEST_VERSION


def reinitialize_refusal(rid: Any, version: str) -> dict[str, Any]:
    """The answer to an ``initialize`` after the one that negotiated ``version``.

    MCP: initialization is the first interaction and happens once, so a second
    ``initialize`` is an Invalid Request (``-32600``, with its id) and the version
    stays. It was served: its answer named another version, and batches were judged
    by that one from then on, mid-session."""
    message = f"invalid request: already initialized (protocol version {version})"
    return jsonrpc.error(rid, jsonrpc.INVALID_REQUEST, message)


def initialize_result(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": negotiate(params),
        "capabilities": {"tools": {}},
        "serverInfo": dict(SERVER_INFO),
    }


def tools_list_result() -> dict[str, Any]:
    return {"tools": TOOLS}


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    @classmethod
    def parse(cls, params: dict[str, Any]) -> ToolCall:
        """§2.4: wrong types → -32602 ``invalid tool params``; unknown tool → -32601."""
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(
                jsonrpc.INVALID_PARAMS,
                f"invalid tool params: name must be a string, got {_kind(name)}",
            )
        arguments = params.get("arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(
                jsonrpc.INVALID_PARAMS,
                f"invalid tool params: arguments must be an object, got {_kind(arguments)}",
            )
        if name not in TOOL_NAMES:
            raise RpcError(jsonrpc.METHOD_NOT_FOUND, f"unknown tool: {name}")
        return cls(name, arguments)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def tool_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def tool_error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": f"Error: {message}"}], "isError": True}


def request_id_of_cancel(params: dict[str, Any]) -> Any:
    """``notifications/cancelled`` names the request to abandon."""
    return params.get("requestId")
