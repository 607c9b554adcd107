"""Sans-I/O pieces of the ACP stdio client: line splitting, envelopes, id spaces.

Nothing here touches a process or a socket; :mod:`.agent` does the I/O.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import orjson

from xwm_bridge import jsonrpc

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024 * 1024
CLIENT_INFO = {"name": "xwm-bridge", "version": "1"}

# JSON-RPC error codes used toward the agent
METHOD_NOT_FOUND = jsonrpc.METHOD_NOT_FOUND
INVALID_PARAMS = jsonrpc.INVALID_PARAMS
INTERNAL_ERROR = jsonrpc.INTERNAL_ERROR
RESOURCE_NOT_FOUND = -32002


class LineSplitter:
    """Split a byte stream into lines; a line over ``limit`` is dropped, not fatal.

    ``feed`` returns complete lines and counts oversized ones in ``dropped``; the
    bytes of an oversized line are discarded up to its newline without buffering.
    """

    def __init__(self, limit: int = MAX_LINE_BYTES) -> None:
        self._limit = limit
        self._buf = bytearray()
        self._skipping = False
        self.dropped = 0

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            end = len(data) if nl < 0 else nl
            if not self._skipping:
                self._buf += data[start:end]
                if len(self._buf) > self._limit:
                    self._buf.clear()
                    self._skipping = True
                    self.dropped += 1
            if nl < 0:
                break
            if not self._skipping:
                line = bytes(self._buf).strip()
                if line:
                    lines.append(line)
            self._buf.clear()
            self._skipping = False
            start = nl + 1
        return lines


@dataclass(frozen=True, slots=True)
class Incoming:
    """One decoded message from the agent."""

    kind: str  # "response" | "request" | "notification" | "invalid"
    id: Any = None
    method: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    result: Any = None
    error: dict[str, Any] | None = None
    detail: str = ""


#: an agent message gets the bridge-wide cap on its params/result, plus the envelope
_MESSAGE_DEPTH = jsonrpc.MAX_DEPTH + 1
TOO_DEEP = f"agent message nested deeper than {jsonrpc.MAX_DEPTH} levels"


def decode(line: bytes) -> Incoming:
    """One agent line. A message nested past the cap is never passed on: a response
    to one of our requests becomes an error response, anything else is invalid."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return Incoming("invalid", detail=f"not JSON: {exc}")
    if not isinstance(obj, dict):
        return Incoming("invalid", detail="not a JSON object")
    if jsonrpc.may_nest(line, _MESSAGE_DEPTH) and jsonrpc.nesting_exceeds(obj, _MESSAGE_DEPTH):
        rid = obj.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool) and "method" not in obj:
            return Incoming("response", id=rid, error={"code": INVALID_PARAMS, "message": TOO_DEEP})
        return Incoming("invalid", detail=TOO_DEEP)
    method = obj.get("method")
    raw_params = obj.get("params")
    params = raw_params if isinstance(raw_params, dict) else {}
    if isinstance(method, str) and method:
        if "id" in obj and obj["id"] is not None:
            return Incoming("request", id=obj["id"], method=method, params=params)
        return Incoming("notification", method=method, params=params)
    if "id" in obj and ("result" in obj or "error" in obj):
        err = obj.get("error")
        return Incoming(
            "response",
            id=obj["id"],
            result=obj.get("result"),
            error=err if isinstance(err, dict) else ({"message": str(err)} if err else None),
        )
    return Incoming("invalid", detail="neither request, response nor notification")


def request(rid: int, method: str, params: dict[str, Any]) -> bytes:
    return jsonrpc.dumps_line(jsonrpc.request(rid, method, params))


def notification(method: str, params: dict[str, Any]) -> bytes:
    return jsonrpc.dumps_line(jsonrpc.notification(method, params))


def response(rid: Any, result: Any) -> bytes:
    return jsonrpc.dumps_line(jsonrpc.result(rid, result))


def error_response(rid: Any, code: int, message: str) -> bytes:
    return jsonrpc.dumps_line(jsonrpc.error(rid, code, message))


class IdSpace:
    """Ids of *our* requests. The agent's own request ids live in their own space
    (they may be 0, small ints or strings) and are only ever echoed back."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def next(self) -> int:
        return next(self._next)


def client_capabilities(*, fs_read: bool, fs_write: bool, terminal: bool) -> dict[str, Any]:
    return {"fs": {"readTextFile": fs_read, "writeTextFile": fs_write}, "terminal": terminal}


def initialize_params(protocol_version: int, capabilities: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": protocol_version,
        "clientCapabilities": capabilities,
        "clientInfo": dict(CLIENT_INFO),
    }


def prompt_blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


#: turn param carrying a prompt's ACP content blocks (set by the ACP front door; never
#: sent upstream: core/turn.py strips it)
PROMPT_BLOCKS_PARAM = "acpPrompt"


def content_blocks(blocks: Any, init_result: dict[str, Any], text: str) -> list[dict[str, Any]]:
    """The ``session/prompt`` blocks for an agent: the client's own ACP blocks where the
    agent's ``promptCapabilities`` take them (images, embedded resources), else text."""
    if not isinstance(blocks, list) or not blocks:
        return prompt_blocks(text)
    agent_caps = init_result.get("agentCapabilities")
    caps = agent_caps.get("promptCapabilities") if isinstance(agent_caps, dict) else None
    caps = caps if isinstance(caps, dict) else {}
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        taken = (
            kind in ("text", "resource_link")
            or (kind == "image" and caps.get("image") is True)
            or (kind == "resource" and caps.get("embeddedContext") is True)
        )
        if taken:
            out.append(block)
        elif kind == "resource":
            res = block.get("resource") or {}
            body = res.get("text") if isinstance(res.get("text"), str) else ""
            out.append(
                {
                    "type": "text",
                    "text": f'<resource uri="{res.get("uri", "")}">\n{body}\n</resource>',
                }
            )
        elif kind == "image":
            mime = block.get("mimeType", "image")
            out.append({"type": "text", "text": f"[{mime} omitted: this agent takes no images]"})
    return out or prompt_blocks(text)
