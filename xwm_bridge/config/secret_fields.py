"""Which config values are credentials: the ``Secret`` mark and the finders behind
:meth:`BridgeConfig.secrets <xwm_bridge.config.model.BridgeConfig.secrets>`,
:meth:`~xwm_bridge.config.model.BridgeConfig.credentials` and ``doctor``'s masking."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar, get_args, get_origin, get_type_hints
from urllib.parse import unquote_plus, urlsplit, urlunsplit

SECRET_MARK = "secret"
#: what a credential shows as in a config's ``repr``
MASK = "***"
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


#: a flag or query parameter name that says its value is a credential: it ends with
#: the word (``--api-key``, ``--auth-token``, ``?access_token=``, ``?sig=``), so that
#: ``--max-tokens 4096`` or ``?token_limit=`` do not make ``4096`` a secret masked in
#: every reply
_SECRET_PARAM = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PWD|CREDENTIALS?|COOKIE|AUTH|AUTHORIZATION|SIG|SIGNATURE)$",
    re.IGNORECASE,
)


def _secret_param(name: str) -> bool:
    return bool(_SECRET_PARAM.search(unquote_plus(name).lstrip("-")))


def url_password(value: str) -> str:
    try:
        return urlsplit(value.strip()).password or ""
    except ValueError:
        return ""


def _query_items(url: str) -> list[tuple[str, str, str]]:
    """(name, ``=`` or ``""``, value) of each item of a URL's query, as written."""
    if "?" not in url:
        return []
    try:
        query = urlsplit(url.strip()).query
    except ValueError:
        return []
    return [item.partition("=") for item in query.split("&")]


#: a value under a credential-named flag or query parameter shorter than this is not
#: taken for one (``--oauth yes``): credentials are masked in every reply, whatever
#: their length, and ``yes`` would be masked in all of them
MIN_GUESSED_SECRET = 8


def url_query_secrets(url: str) -> list[str]:
    """The values of a URL's query parameters whose name says credential
    (``?api_key=…``, ``&access_token=…``: :data:`_SECRET_PARAM`), as written and
    decoded, from :data:`MIN_GUESSED_SECRET` characters."""
    out: list[str] = []
    for name, _, value in _query_items(url):
        if len(value) >= MIN_GUESSED_SECRET and _secret_param(name):
            out += [value, unquote_plus(value)]
    return out


#: config fields holding an argv (a stdio agent's ``command``, an MCP server's ``args``)
ARGV_FIELDS = frozenset({"command", "args"})


def _secret_flags(argv: Sequence[str]) -> list[tuple[int, str]]:
    """Where an argv holds the values of flags whose name says credential
    (:data:`_SECRET_PARAM`): (index, the flag's ``--name=`` for the joined form, else
    ``""``) of ``--token=X`` and of the item after ``--api-key`` (unless a flag too)."""
    spots: list[tuple[int, str]] = []
    for i, arg in enumerate(argv):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if not _secret_param(name):
            continue
        if eq:
            if value:
                spots.append((i, name + "="))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            spots.append((i + 1, ""))
    return spots


def flag_secrets(argv: Sequence[str]) -> list[str]:
    """The credential values :func:`_secret_flags` finds, from
    :data:`MIN_GUESSED_SECRET` characters."""
    values = (argv[i][len(prefix) :] for i, prefix in _secret_flags(argv))
    return [v for v in values if len(v) >= MIN_GUESSED_SECRET]


def mask_flags(argv: Sequence[str], mask: str = MASK) -> tuple[str, ...]:
    """``argv`` with every value :func:`_secret_flags` finds shown as ``mask``."""
    out = list(argv)
    for i, prefix in _secret_flags(argv):
        out[i] = prefix + mask
    return tuple(out)


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


#: fields of ``NAME=value`` items (``headers``: ``Name: value``) whose values a ``repr``
#: never shows: an agent's environment holds keys under any name
_ITEM_FIELDS = {"env": "=", "toolbridge_env": "=", "mcp_env": "=", "headers": ":"}

T = TypeVar("T")


def mask_userinfo(url: str, mask: str = MASK) -> str:
    """``scheme://user:password@host`` → ``scheme://user:<mask>@host``; a userinfo
    without a password (a token as user name) → ``scheme://<mask>@host``."""
    if "://" not in url or "@" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return mask
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, _ = userinfo.partition(":")
    masked_info = f"{user}:{mask}" if has_password else mask
    return urlunsplit(parts._replace(netloc=f"{masked_info}@{host}"))


def mask_url(url: str, mask: str = MASK) -> str:
    """:func:`mask_userinfo`, and the values of the query parameters whose name says
    credential (``?api_key=<mask>&mode=fast``)."""
    url = mask_userinfo(url, mask)
    items = _query_items(url)
    if not any(v and _secret_param(k) for k, _, v in items):
        return url
    query = "&".join(f"{k}={mask}" if v and _secret_param(k) else k + eq + v for k, eq, v in items)
    try:
        return urlunsplit(urlsplit(url)._replace(query=query))
    except ValueError:
        return mask


def _masked(name: str, value: Any, hint: Any) -> Any:
    if _is_secret(hint):
        if isinstance(value, tuple):
            return tuple(MASK if v else v for v in value)
        return MASK if isinstance(value, str) and value else value
    if isinstance(value, str):
        return mask_url(value)
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        if name in ARGV_FIELDS:
            return tuple(mask_url(v) for v in mask_flags(value, MASK))
        sep = _ITEM_FIELDS.get(name)
        if sep is not None:
            return tuple(
                f"{k}{sep}{MASK if sep == '=' else ' ' + MASK}" if found else k
                for k, found, _ in (v.partition(sep) for v in value)
            )
        return tuple(mask_url(v) for v in value)
    return value


def masked_repr(self: Any) -> str:
    """A config dataclass's ``repr`` without its credentials: ``Secret`` fields, the
    user info of URLs and their credential query parameters, the values of credential
    flags in an argv and the values of ``env``/``headers`` items show as ``***``
    (nested sections and providers mask their own)."""
    hints = get_type_hints(type(self), include_extras=True)
    shown = (
        f"{f.name}={_masked(f.name, getattr(self, f.name), hints[f.name])!r}"
        for f in dataclasses.fields(self)
        if f.repr
    )
    return f"{type(self).__qualname__}({', '.join(shown)})"


def masked(cls: type[T]) -> type[T]:
    """Class decorator (above ``@dataclass``): :func:`masked_repr` as its ``repr``."""
    cls.__repr__ = masked_repr  # type: ignore[method-assign]
    return cls
