"""Tool ``vault_kv``: KV v2 get/put/list/delete through ``hvac`` (adapters.md §3).

Address and token come from the config/environment only, never from a tool
argument. Mount and path are validated (no empty, ``.`` or ``..`` segments, no
URL metacharacters) and checked against ``toolbridge.vault_allowed_paths``.
hvac is synchronous: each call runs in a worker thread and carries hvac's own
request timeout, so the thread never outlives ``vault_timeout`` by much.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any

import hvac
import hvac.exceptions
import orjson
import requests

from xwm_bridge import coerce
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.proxy import ProxyRoute, ProxySettings
from xwm_bridge.toolbridge.tools import ToolError

#: urllib3's words for a proxy that refused CONNECT
_TUNNEL_STATUS = re.compile(r"Tunnel connection failed: ([0-9]{3})")

OPERATIONS = {"read": "read", "get": "read", "write": "write", "put": "write"}
OPERATIONS |= {"list": "list", "delete": "delete"}
#: a whole segment (``fullmatch``: ``$`` also matches before a final newline)
_SEGMENT = re.compile(r"[A-Za-z0-9_.@+=,:~ -]+")
MAX_PATH = 512


@dataclass(frozen=True, slots=True)
class VaultCall:
    operation: str
    mount: str
    path: str
    data: dict[str, Any]
    cas: int | None

    @classmethod
    def parse(cls, cfg: ToolbridgeConfig, args: dict[str, Any]) -> VaultCall:
        """§3.1, in the spec's order, then this project's path rules."""
        if not cfg.vault_url:
            raise ToolError("VAULT_SERVER_URL environment variable not set")
        if not cfg.vault_token:
            raise ToolError("VAULT_SERVER_ROOT_ACCESS_TOKEN environment variable not set")
        raw_op = coerce.text(args.get("operation")).lower()
        if not raw_op:
            raise ToolError("operation is required")
        path = coerce.text(args.get("path")).strip("/")
        if not path and OPERATIONS.get(raw_op) != "list":
            raise ToolError("path is required")
        data = _data(args.get("data"))
        mount = coerce.text(args.get("mount")).strip("/") or "secret"
        cas = _cas(args.get("cas"))
        operation = OPERATIONS.get(raw_op)
        if operation is None:
            raise ToolError(f"unsupported operation: {raw_op}")
        _check_segment(mount, "mount")
        if len(path) > MAX_PATH:
            raise ToolError(f"path is longer than {MAX_PATH} characters")
        for segment in path.split("/") if path else ():
            _check_segment(segment, "path")
        _check_allowed(cfg.vault_allowed_paths, mount, path)
        if operation == "write" and not data:
            raise ToolError("data is required for write operations")
        return cls(operation, mount, path, data, cas)


def _data(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            doc = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise ToolError("data must be a JSON object") from None
        if not isinstance(doc, dict):
            raise ToolError("data must be a JSON object")
        return doc
    raise ToolError("data must be an object")


def _cas(value: Any) -> int | None:
    if isinstance(value, bool) or not coerce.text(value).isascii():
        return None  # float() also reads "١٢" as 12
    try:
        number = int(value if isinstance(value, (int, float)) else float(coerce.text(value)))
    except (ValueError, OverflowError):  # not a number, NaN, or ±inf ("inf", "1e400")
        return None
    return number if number > 0 else None


def _check_segment(segment: str, what: str) -> None:
    if segment in ("", ".", "..") or not _SEGMENT.fullmatch(segment):
        raise ToolError(f"invalid {what}: {segment!r}")


def _check_allowed(allowed: tuple[str, ...], mount: str, path: str) -> None:
    if not allowed:
        return
    target = f"{mount}/{path}".rstrip("/")
    for prefix in allowed:
        prefix = prefix.strip("/")
        if target == prefix or target.startswith(prefix + "/"):
            return
    raise ToolError(f"path not allowed: {target}")


def _client(cfg: ToolbridgeConfig, route: ProxyRoute | None) -> hvac.Client:
    # requests' own reading of the environment (its NO_PROXY rules, ~/.netrc) is off:
    # the proxy is the one xwm_bridge/proxy.py chose for the Vault URL, or none
    session = requests.Session()
    session.trust_env = False
    url = cfg.vault_url.rstrip("/")
    scheme = url.split(":", 1)[0].lower()
    return hvac.Client(
        url=url,
        token=cfg.vault_token,
        namespace=cfg.vault_namespace or None,
        timeout=max(1, math.ceil(cfg.vault_timeout)),
        session=session,
        proxies={scheme: route.url} if route is not None else None,
    )


def _proxy_error(exc: requests.RequestException, route: ProxyRoute | None) -> str | None:
    if route is None or not isinstance(exc, requests.exceptions.ProxyError):
        return None
    status = _TUNNEL_STATUS.search(str(exc))
    return route.refused(int(status.group(1))) if status else route.unreachable("no tunnel")


def _error_text(exc: hvac.exceptions.VaultError) -> str:
    status = {
        hvac.exceptions.InvalidRequest: 400,
        hvac.exceptions.Unauthorized: 401,
        hvac.exceptions.Forbidden: 403,
        hvac.exceptions.InvalidPath: 404,
    }
    code = next((c for t, c in status.items() if isinstance(exc, t)), None)
    detail = ", ".join(exc.errors) if exc.errors else (exc.args[0] if exc.args else "")
    if code is None:
        return f"vault api error: {detail or type(exc).__name__}"
    return f"vault api error {code}: {detail}".rstrip(": ")


def _object(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a JSON object (absent: ``{}``). hvac hands back the raw
    ``requests.Response`` for anything but a 200 with a JSON body (a login page, a
    proxy's answer): that, or a JSON value of the wrong shape, is a tool error."""
    if isinstance(value, requests.Response):
        if value.status_code == 204:
            return {}
        kind = value.headers.get("Content-Type", "no content type").split(";")[0]
        raise ToolError(f"vault api error: unexpected response (HTTP {value.status_code}, {kind})")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ToolError(f"vault api error: unexpected response ({what} is not a JSON object)")
    return value


def _run(cfg: ToolbridgeConfig, call: VaultCall, route: ProxyRoute | None) -> dict[str, Any]:
    kv = _client(cfg, route).secrets.kv.v2
    out: dict[str, Any] = {"operation": call.operation, "mount": call.mount, "path": call.path}
    if call.operation == "read":
        resp = kv.read_secret_version(
            path=call.path, mount_point=call.mount, raise_on_deleted_version=True
        )
        body = _object(_object(resp, "the body").get("data"), "data")
        out["data"] = _object(body.get("data"), "data.data")
        out["metadata"] = _object(body.get("metadata"), "data.metadata")
    elif call.operation == "write":
        resp = kv.create_or_update_secret(
            path=call.path, secret=call.data, cas=call.cas, mount_point=call.mount
        )
        out["data"] = call.data
        # Vault puts version/created_time directly under data (weakness in §3.4 fixed)
        out["metadata"] = _object(_object(resp, "the body").get("data"), "data")
    elif call.operation == "list":
        resp = kv.list_secrets(path=call.path, mount_point=call.mount)
        keys = _object(_object(resp, "the body").get("data"), "data").get("keys") or []
        if not isinstance(keys, list):
            raise ToolError("vault api error: unexpected response (data.keys is not a list)")
        out["keys"] = [str(k) for k in keys]
    else:
        kv.delete_latest_version_of_secret(path=call.path, mount_point=call.mount)
    return {k: v for k, v in out.items() if v or k in ("operation", "mount", "path")}


async def vault_kv(
    cfg: ToolbridgeConfig, args: dict[str, Any], proxies: ProxySettings | None = None
) -> str:
    call = VaultCall.parse(cfg, args)
    route = proxies.for_url(cfg.vault_url) if proxies is not None else None
    try:
        async with asyncio.timeout(cfg.vault_timeout + 5):
            result = await asyncio.to_thread(_run, cfg, call, route)
    except hvac.exceptions.VaultError as exc:
        raise ToolError(_error_text(exc)) from None
    except requests.RequestException as exc:
        proxy = _proxy_error(exc, route)
        raise ToolError(f"vault request failed: {proxy or type(exc).__name__}") from None
    except TimeoutError:
        raise ToolError(f"vault request timed out after {cfg.vault_timeout:g}s") from None
    return orjson.dumps(result, option=orjson.OPT_INDENT_2).decode()
