"""Sans-I/O JSON-RPC framing of the ACP front door: classify one incoming message.

ACP is bidirectional: a client sends requests and notifications, and answers the
requests the bridge sends it (``session/request_permission``, ``fs/*``,
``terminal/*``). :func:`decode` sorts one frame into a :class:`~xwm_bridge.jsonrpc.Request`
(``id`` ``None`` for a notification), a :class:`Response`, or an :class:`Invalid`
carrying the JSON-RPC error to answer with (never an exception).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

from xwm_bridge import jsonrpc
from xwm_bridge.framing import head_members

PROTOCOL_VERSION: Final = 1
#: JSON-RPC codes ACP uses besides the standard ones
RESOURCE_NOT_FOUND: Final = -32002
REQUEST_CANCELLED: Final = -32800
TOO_DEEP: Final = f"invalid params: nested deeper than {jsonrpc.MAX_DEPTH} levels"


@dataclass(frozen=True, slots=True)
class Response:
    """The client's answer to one of the bridge's requests."""

    id: Any
    result: Any = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Invalid:
    """A frame that cannot be served; ``reply`` is the error envelope to send, if any.
    ``dropped`` says why a notification was not served (it is never answered)."""

    reply: dict[str, Any] | None
    dropped: str = ""


Incoming = jsonrpc.Request | Response | Invalid


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


#: the bridge-wide cap on params and results (jsonrpc.MAX_DEPTH), plus the envelope
_FRAME_DEPTH: Final = jsonrpc.MAX_DEPTH + 1


def decode(data: bytes | str) -> Incoming:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return Invalid(jsonrpc.error(None, jsonrpc.PARSE_ERROR, f"parse error: {exc}"))
    if (
        isinstance(obj, dict)
        and jsonrpc.may_nest(data, _FRAME_DEPTH)
        and jsonrpc.nesting_exceeds(obj, _FRAME_DEPTH)
    ):
        return _too_deep(obj)
    if isinstance(obj, list):
        return Invalid(
            jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "batch requests are not supported")
        )
    if not isinstance(obj, dict):
        return Invalid(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "expected a JSON object"))
    rid = obj.get("id")
    has_id = rid is not None
    if has_id and not _valid_id(rid):
        return Invalid(
            jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "id must be a string or an integer")
        )
    reply_id = rid if has_id else None
    if "method" in obj:
        # a request is a frame with an id member, null included (ACP v1's RequestId and
        # JSON-RPC 2.0 allow it: answered with id null); without one, a notification
        is_request = "id" in obj
        method = obj["method"]
        if not isinstance(method, str) or not method.strip():
            return _invalid(reply_id, has_id, jsonrpc.INVALID_REQUEST, "method must be a string")
        params = obj.get("params")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            if not is_request:  # a notification is never answered, not even an error
                return Invalid(None, f"{method[:64]}: params must be an object")
            return _invalid(reply_id, has_id, jsonrpc.INVALID_PARAMS, "params must be an object")
        return jsonrpc.Request(method, params, rid, notification=not is_request)
    if "result" in obj or "error" in obj:
        if not has_id:  # JSON-RPC: a response is never answered (one without an id
            return Invalid(None)  # is a peer's complaint: answering it could loop)
        err = obj.get("error")
        if err is not None and not isinstance(err, dict):
            err = {"code": jsonrpc.INTERNAL_ERROR, "message": str(err)}
        return Response(rid, obj.get("result"), err)
    return _invalid(
        reply_id, has_id, jsonrpc.INVALID_REQUEST, "not a request, notification or response"
    )


def _too_deep(obj: dict[str, Any]) -> Incoming:
    """A frame nested past the cap (issue 16): a request gets ``-32602``, an answer to
    one of the bridge's requests becomes an error answer; nothing of it is kept."""
    rid = obj.get("id")
    rid = rid if _valid_id(rid) else None
    method = obj.get("method")
    if isinstance(method, str) and method.strip() and "id" not in obj:
        return Invalid(None, f"{method[:64]}: {TOO_DEEP}")  # a notification: never answered
    if "method" not in obj and ("result" in obj or "error" in obj):
        if rid is None:
            return Invalid(None)  # a response, never answered
        return Response(rid, None, {"code": jsonrpc.INVALID_PARAMS, "message": TOO_DEEP})
    return Invalid(jsonrpc.error(rid, jsonrpc.INVALID_PARAMS, TOO_DEEP))


def _invalid(rid: Any, has_id: bool, code: int, message: str) -> Invalid:
    # a frame that is not a valid request, even one without an id, is an Invalid Request
    # answered with id null (JSON-RPC 2.0); a well-formed notification never is (above)
    return Invalid(jsonrpc.error(rid if has_id else None, code, message))


# --- a frame past the size limit, known by its first bytes ---------------------------


def too_large(head: bytes, message: str) -> Incoming:
    """A frame past the size limit, of which only ``head`` (its first bytes) was kept.

    A request whose ``method`` and ``id`` are there gets its error by that id (else the
    client would wait for the answer for ever); an answer to one of the bridge's
    requests becomes an error answer, so the request fails now rather than at its
    deadline. Anything else gets the ``-32700`` with id null it always got."""
    scalars, names = head_members(head)
    rid = scalars.get("id")
    if _valid_id(rid) and "method" in names:
        return Invalid(jsonrpc.error(rid, jsonrpc.INVALID_PARAMS, f"invalid params: {message}"))
    if _valid_id(rid) and "method" not in names and ("result" in names or "error" in names):
        error = {"code": jsonrpc.INTERNAL_ERROR, "message": f"the ACP client's answer: {message}"}
        return Response(rid, None, error)
    return Invalid(jsonrpc.error(None, jsonrpc.PARSE_ERROR, message))
