"""The effective configuration as operators see it (``doctor``, the console): every
secret masked.

Masked: every ``Secret``-typed field (tokens, API keys, ``auth_header``, the vault
token, ``admin_tokens``…), the value of every ``env`` item (providers, MCP servers,
``agents.toolbridge_env``) and MCP header, the userinfo
of any URL (the Redis URL's or a provider URL's password) and its credential query
parameters (``?api_key=…``), the values of credential flags in an argv (``--api-key
X``, ``--token=X``), and — as a last line —
any string that contains one of the config's secret values (a short secret is
replaced inside the string).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from xwm_bridge.config import BridgeConfig, secret_field
from xwm_bridge.config.secret_fields import ARGV_FIELDS, mask_flags, mask_url
from xwm_bridge.observability.redact import Redactor

MASK = "********"
#: a secret this long or longer masks the whole string that contains it
_WHOLE = 4


def masked(config: BridgeConfig) -> dict[str, Any]:
    secrets = [s for s in config.secrets() if s]
    long = [s for s in secrets if len(s) >= _WHOLE]
    redactor = Redactor(secrets)

    def scrub(text: str) -> str:
        text = mask_url(text, MASK)
        return MASK if any(s in text for s in long) else redactor.text(text)

    def walk(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: field(value, f.name) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [walk(v) for v in value]
        if isinstance(value, str):
            return scrub(value)
        return value

    def field(owner: Any, name: str) -> Any:
        value = getattr(owner, name)
        if secret_field(owner, name):
            if isinstance(value, tuple):
                return [MASK if v else v for v in value]
            return MASK if value else value
        if name in ("env", "toolbridge_env") and isinstance(value, tuple):
            return [item.split("=", 1)[0] + "=" + MASK for item in value]
        if name == "headers" and isinstance(value, tuple):  # MCP servers: "Name: value"
            return [item.split(":", 1)[0] + ": " + MASK for item in value]
        if name in ARGV_FIELDS and isinstance(value, tuple):  # "--api-key X", "--token=X"
            return walk(mask_flags(value, MASK))
        return walk(value)

    out = walk(config)
    assert isinstance(out, dict)
    return out
