"""Which config values are credentials: the ``Secret`` mark and the finders behind
:meth:`BridgeConfig.secrets <xwm_bridge.config.model.BridgeConfig.secrets>`,
:meth:`~xwm_bridge.config.model.BridgeConfig.credentials` and ``doctor``'s masking."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

SECRET_MARK = "secret"
#: a credential: masked by ``doctor``, redacted from every log line and client reply
Secret = Annotated[str, SECRET_MARK]


def _with_bare(values: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        out.append(value)
        if " " in value.strip():  # also the bare credential of "Bearer x"
            out.append(value.strip().split(" ", 1)[1].strip())
    return tuple(dict.fromkeys(v for v in out if v))


#: a variable or header name that says its value is a credential
_SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|COOKIE|AUTHORIZATION", re.IGNORECASE
)


def url_password(value: str) -> str:
    try:
        return urlsplit(value.strip()).password or ""
    except ValueError:
        return ""


def _is_secret(hint: Any) -> bool:
    """``Secret``, ``Secret | None`` or ``tuple[Secret, ...]``."""
    if get_origin(hint) is Annotated:
        return SECRET_MARK in hint.__metadata__
    return any(_is_secret(arg) for arg in get_args(hint) if arg is not Ellipsis)


def _fields(obj: Any) -> list[tuple[Any, str, Any]]:
    """(dataclass, field name, annotated type) of every field, nested sections and
    providers included."""
    out: list[tuple[Any, str, Any]] = []
    hints = get_type_hints(type(obj), include_extras=True)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out += _fields(value)
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                out += _fields(item)
        else:
            out.append((obj, f.name, hints[f.name]))
    return out


def secret_field(obj: Any, name: str) -> bool:
    """Whether ``name`` of the config dataclass ``obj`` holds a credential."""
    return _is_secret(get_type_hints(type(obj), include_extras=True)[name])
