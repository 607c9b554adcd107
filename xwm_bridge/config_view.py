"""The effective configuration as operators see it (``doctor``, the console): every
secret masked.

Masked: fields named like secrets (tokens, API keys, ``auth_header``), every
value of a stdio provider's ``env``, the password of the Redis URL, and — as a
last line — any string that contains one of the config's secret values.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from xwm_bridge.config import BridgeConfig

MASK = "********"
SECRET_KEYS = frozenset(
    {
        "auth_token",
        "client_tokens",
        "internal_service_token",
        "bridge_auth_token",
        "auth_header",
        "auth_api_key",
        "openclaw_token",
        "llm_api_key",
        "api_key",
        "vault_token",
    }
)


def _mask_url_password(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def masked(config: BridgeConfig) -> dict[str, Any]:
    secrets = [s for s in config.secrets() if s]

    def scrub(text: str) -> str:
        return MASK if any(s in text for s in secrets) else text

    def walk(value: Any, name: str = "") -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: field(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [walk(v, name) for v in value]
        if isinstance(value, str):
            return scrub(value)
        return value

    def field(owner: Any, name: str) -> Any:
        value = getattr(owner, name)
        if name in SECRET_KEYS and value:
            return [MASK for _ in value] if isinstance(value, tuple) else MASK
        if name == "env" and isinstance(value, tuple):
            return [item.split("=", 1)[0] + "=" + MASK for item in value]
        if name == "redis_url" and isinstance(value, str):
            return scrub(_mask_url_password(value))
        return walk(value, name)

    out = walk(config)
    assert isinstance(out, dict)
    return out
