"""Generates docs/architecture/configuration.md from the config schema.

``python -m xwm_bridge.config_doc > docs/architecture/configuration.md``; a test
fails when the committed file drifts from the schema or a key lacks a description.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xwm_bridge.config import (
    CONFIG_FILE_ENV,
    DEFAULT_PROVIDERS,
    ENV_VARS,
    BridgeConfig,
    GatewayConfig,
    Limits,
    ProviderConfig,
    provider_env_var,
)

DESCRIPTIONS: dict[str, str] = {
    "listen": "HOST:PORT to listen on (`serve`); port 0 picks a free port",
    "auth_token": "bearer token clients must present; empty = any non-empty bearer (loopback only)",
    "client_tokens": "more accepted client bearer tokens (comma-separated in env); each owns its own gateway runtimes",
    "allow_unauthenticated": "allow a non-loopback listen address without `auth_token`",
    "allowed_origins": "browser origins allowed on `/acp/rpc` and `/acp`; `scheme://host:*` = any port",
    "internal_service_token": "upstream `Authorization` (normalized to `Bearer …`); accounts `X-Service-Token`",
    "bridge_auth_token": "fallback upstream `Authorization` when `internal_service_token` is empty",
    "multi_agent_enabled": "advertise multi-agent (only once that backend exists in the build)",
    "multi_agent_model": "model for multi-agent turns (used once that backend exists)",
    "routing_model": "model for the LLM routing classifier (used once the router lands)",
    "image": "container image reference reported by `/api/ping`",
    "public_base_url": "this bridge's public URL (bootstrap `bridgeOrigin`, the only accepted `bridge`)",
    "accounts_base_url": "accounts service for `/bridge/bootstrap/consume`",
    "openclaw_url": "endpoint dialed for `gatewayProviderId: openclaw` runtimes (`ws(s)://host:port[/path]`)",
    "openclaw_token": "token sent to the `openclaw` gateway; empty = bare `internal_service_token`/`bridge_auth_token`",
    "allowed_roots": "absolute directories whose files may be returned as artifacts; empty = none",
    "log_level": "debug, info, warning or error",
    "limits.max_body_bytes": "largest HTTP request body (413 above) and stdio message",
    "limits.max_ws_message_bytes": "largest WebSocket message (close 1009 above)",
    "limits.max_queue_depth": "turns allowed to wait behind the running one on a thread (-32004 above)",
    "limits.session_idle_ttl": "seconds after which an idle session is forgotten",
    "limits.request_read_timeout": "seconds to receive a whole request body",
    "limits.keepalive_timeout": "seconds an idle HTTP keep-alive connection stays open",
    "limits.notification_send_timeout": "seconds a client may take to accept one message before it is dropped",
    "limits.ws_heartbeat": "seconds between WebSocket pings (0 = off)",
    "limits.artifact_max_files": "files returned as artifacts per result",
    "limits.artifact_max_file_bytes": "largest artifact file",
    "limits.artifact_max_total_bytes": "total artifact bytes per result",
    "limits.upstream_cancel_timeout": "seconds allowed for the `session.cancel` sent upstream",
    "limits.bootstrap_requests_per_minute": "bootstrap consume calls per client address per minute (0 = unlimited)",
    "limits.bootstrap_timeout": "seconds for the accounts service call",
    "limits.shutdown_grace": "seconds running turns may finish after SIGTERM before being cancelled",
    "gateway.connect_timeout": "seconds to open the gateway WebSocket",
    "gateway.challenge_timeout": "seconds to wait for `connect.challenge` after the dial",
    "gateway.hello_timeout": "seconds to wait for the `connect` response (`hello-ok`)",
    "gateway.request_timeout": "default deadline of `xworkmate.gateway.request`, in seconds",
    "gateway.turn_timeout": "deadline of a gateway-mode turn; on expiry the run is aborted (`chat.abort`)",
    "gateway.abort_timeout": "seconds allowed for the `chat.abort` of a cancelled or expired turn",
    "gateway.idle_ttl": "a runtime with no request and no live owner WebSocket for this long is closed",
    "gateway.backoff_initial": "first reconnect delay in seconds (doubles, with jitter, reset on hello-ok)",
    "gateway.backoff_max": "longest reconnect delay in seconds",
    "gateway.notify_timeout": "seconds one client may take to accept a gateway notification",
    "gateway.max_runtimes_per_principal": "runtimes one client token may hold",
    "gateway.max_message_bytes": "largest frame accepted from a gateway",
    "gateway.forward_client_bearer": "send the caller's bearer as `auth.token` to a `local` gateway given no token",
    "gateway.allowed_hosts": "hosts or `host:port` a `local` runtime may dial; empty = any (set it: the client picks the host)",
    "providers[].id": "provider id (unique, compared case-insensitively)",
    "providers[].label": "label shown in `acp.capabilities`",
    "providers[].endpoint": "`http(s)://` (HTTP, SSE when offered) or `ws(s)://` (WebSocket) ACP endpoint",
    "providers[].enabled": "a disabled provider is not advertised and cannot be routed to",
    "providers[].auth_header": '`Authorization` for this provider; unset = the shared upstream token; "" = none',
    "providers[].stream": "ask HTTP upstreams for SSE so notifications stream through",
    "providers[].connect_timeout": "seconds to connect",
    "providers[].read_timeout": "longest silence from the upstream, in seconds",
    "providers[].total_timeout": "hard cap on one forwarded turn, in seconds",
}


def _default(value: Any) -> str:
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value) if value else "(empty)"
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return "(empty)"
    return f"`{value}`"


def _rows(cls: type[Any], prefix: str) -> list[tuple[str, str, str]]:
    rows = []
    instance = cls() if cls is not ProviderConfig else ProviderConfig(id="x")
    for f in dataclasses.fields(cls):
        if f.name in ("limits", "providers", "gateway"):
            continue
        key = f"{prefix}{f.name}"
        value = getattr(instance, f.name)
        rows.append(
            (
                key,
                _default(value) if cls is not ProviderConfig or f.name != "id" else "—",
                DESCRIPTIONS[key],
            )
        )
    return rows


def render() -> str:
    out = [
        "# Configuration reference",
        "",
        "Generated from `xwm_bridge/config.py` by `python -m xwm_bridge.config_doc`; a test fails",
        "when this file drifts. Precedence: **defaults < YAML file < environment < flags**.",
        f"The YAML file is `--config FILE` or `{CONFIG_FILE_ENV}`; strings may use `${{VAR}}` or",
        "`${VAR:-default}`. Environment values are trimmed and a blank value counts as unset.",
        "A bad key or value stops the daemon at start with one line naming it (exit 2).",
        "",
        "## Top-level keys",
        "",
        "| Key | Env var | Default | Meaning |",
        "| --- | --- | --- | --- |",
    ]
    for key, default, doc in _rows(BridgeConfig, ""):
        env = f"`{ENV_VARS[key]}`" if key in ENV_VARS else "—"
        out.append(f"| `{key}` | {env} | {default} | {doc} |")
    out += ["", "## `limits`", "", "| Key | Default | Meaning |", "| --- | --- | --- |"]
    for key, default, doc in _rows(Limits, "limits."):
        out.append(f"| `{key}` | {default} | {doc} |")
    out += ["", "## `gateway`", "", "| Key | Default | Meaning |", "| --- | --- | --- |"]
    for key, default, doc in _rows(GatewayConfig, "gateway."):
        out.append(f"| `{key}` | {default} | {doc} |")
    out += [
        "",
        "## `providers` (list; order is the catalog order)",
        "",
        "| Key | Default | Meaning |",
        "| --- | --- | --- |",
    ]
    for key, default, doc in _rows(ProviderConfig, "providers[]."):
        out.append(f"| `{key}` | {default} | {doc} |")
    out += [
        "",
        "Each provider's endpoint can also be set from the environment as",
        "`XWM_PROVIDER_<ID>_URL` (id upper-cased, other characters as `_`). Default catalog:",
        "",
        "| id | label | endpoint | env override |",
        "| --- | --- | --- | --- |",
    ]
    for p in DEFAULT_PROVIDERS:
        out.append(f"| `{p.id}` | {p.label} | `{p.endpoint}` | `{provider_env_var(p.id)}` |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(), end="")
