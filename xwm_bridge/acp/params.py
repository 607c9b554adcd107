"""The params of ACP requests, checked before any effect (sans-I/O).

Each function reads one request's ``params`` and returns the value a handler of
``acp/methods.py`` uses, or raises ``-32602`` naming what is wrong; the
``session/list`` cursor is encoded and decoded here too.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
from typing import Any

import orjson

from xwm_bridge import coerce
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.providers.stdio import mcp


def text_param(params: dict[str, Any], key: str) -> str:
    """A required non-empty string, stripped."""
    value = params.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RpcError(INVALID_PARAMS, f"{key} is required (a non-empty string)")
    return value.strip()


def absolute_cwd(params: dict[str, Any]) -> str:
    """The required ``cwd``: an absolute path."""
    cwd = coerce.path_text(text_param(params, "cwd"), "cwd")  # no NUL: no path holds one
    if not os.path.isabs(cwd):
        raise RpcError(INVALID_PARAMS, f"cwd must be an absolute path, got {cwd!r}")
    return cwd


def list_cwd(params: dict[str, Any]) -> str | None:
    """The optional ``cwd`` filter of ``session/list``: absent, or an absolute path."""
    cwd = params.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not os.path.isabs(cwd)):
        raise RpcError(INVALID_PARAMS, "cwd must be an absolute path")
    return cwd


def mcp_servers(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The client's ``mcpServers``, validated (as stdio agents take them)."""
    try:
        return mcp.parse_client(params.get("mcpServers", []))
    except mcp.McpError as exc:
        raise RpcError(INVALID_PARAMS, str(exc)) from None


def protocol_version(params: dict[str, Any]) -> int:
    """The ``protocolVersion`` of ``initialize``: a non-negative integer."""
    version = params.get("protocolVersion")
    if isinstance(version, str):
        # a legacy string (the date versions of pre-v1 clients): version 0 to the
        # official SDKs, never refused; the answer is the version this agent speaks
        return 0
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RpcError(INVALID_PARAMS, "protocolVersion is required (an integer)")
    return version


def encode_cursor(updated_at: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([updated_at, session_id])).decode()


def decode_cursor(cursor: Any) -> tuple[float, str] | None:
    if cursor is None:
        return None
    try:
        at, sid = orjson.loads(base64.urlsafe_b64decode(str(cursor).encode()))
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise RpcError(INVALID_PARAMS, "invalid cursor") from None
    # what encode_cursor writes: a finite number and a session id (not "nan", a bool…)
    if type(at) not in (int, float) or not math.isfinite(at) or not isinstance(sid, str):
        raise RpcError(INVALID_PARAMS, "invalid cursor")
    return float(at), sid
