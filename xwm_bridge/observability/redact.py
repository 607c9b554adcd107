"""Secret redaction for log lines and for everything the bridge sends to a client.

Every configured secret is masked wherever it appears in a string value,
whatever its length, and also in its JSON-escaped form (a token holding ``"``
or ``\\`` appears as ``\\"`` or ``\\\\`` inside a JSON document, so a plain byte
search for it would miss it).

The common case costs one substring search per secret form over the encoded
bytes; only a document that holds a secret is rebuilt, with its string values
redacted, and its keys too where a secret of at least ``KEY_SECRET_LEN`` characters
is in one (an env or header map keyed by a token, a path that holds one; a shorter
secret is masked in values only, so that the protocol's names stay as they are), and
encoded again, so the output stays valid JSON.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import orjson

REDACTED = "[REDACTED]"
_REDACTED_B = REDACTED.encode()
#: containers deeper than this are replaced, not walked (input is capped far below it)
_MAX_WALK = 200
#: secrets learnt at run time (a client's MCP env, say) are redacted from this length
#: on; configured secrets whatever their length
MIN_SECRET_LEN = 4
#: a secret is masked in keys from this length on (protocol names are short words)
KEY_SECRET_LEN = 8

#: every live redactor (logs, wire encoders), so secrets learnt at run time reach all
_LIVE: weakref.WeakSet[Redactor] = weakref.WeakSet()


def add_secrets(values: Iterable[str]) -> None:
    """Redact these values from every log line and client message from now on."""
    values = tuple(values)
    for redactor in list(_LIVE):
        redactor.add(values)


class Redactor:
    """Replaces every configured secret value by ``[REDACTED]``."""

    __slots__ = ("__weakref__", "_keys", "_needles", "_text")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._set(secrets)
        _LIVE.add(self)

    def _set(self, secrets: Iterable[str]) -> None:
        # longest first, so a "Bearer x" value is replaced before its bare "x"
        values = sorted({s for s in secrets if s}, key=len, reverse=True)
        self._text = tuple(values)
        self._keys = tuple(v for v in values if len(v) >= KEY_SECRET_LEN)
        forms = {v.encode() for v in values} | {orjson.dumps(v)[1:-1] for v in values}
        self._needles = tuple(sorted(forms, key=len, reverse=True))

    def add(self, secrets: Iterable[str]) -> None:
        """Also redact these values (learnt at run time; shorter ones are ignored)."""
        new = {s for s in secrets if len(s) >= MIN_SECRET_LEN} - set(self._text)
        if new:
            self._set([*self._text, *new])

    def __bool__(self) -> bool:
        return bool(self._text)

    def hit(self, data: bytes) -> bool:
        """Whether ``data`` (encoded JSON, or any bytes) may hold a secret."""
        for needle in self._needles:  # noqa: SIM110 (a loop, not any(): no generator per call)
            if needle in data:
                return True
        return False

    def text(self, value: str) -> str:
        for secret in self._text:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value

    def redact_bytes(self, data: bytes) -> bytes:
        """Raw bytes (not JSON): every form of every secret replaced."""
        for needle in self._needles:
            if needle in data:
                data = data.replace(needle, _REDACTED_B)
        return data

    def value(self, obj: Any, depth: int = 0) -> Any:
        """A copy of ``obj`` with every string value redacted, and every key that holds a
        secret of at least ``KEY_SECRET_LEN`` characters."""
        if isinstance(obj, str):
            return self.text(obj)
        if depth >= _MAX_WALK and isinstance(obj, (dict, list, tuple)):
            return "[nested too deeply]"
        if isinstance(obj, dict):
            return {self._key(k): self.value(v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.value(v, depth + 1) for v in obj]
        return obj

    def _key(self, key: Any) -> Any:
        if isinstance(key, str):
            for secret in self._keys:
                if secret in key:
                    key = key.replace(secret, REDACTED)
        return key

    def dumps(self, obj: Any, option: int = 0) -> bytes:
        """``orjson.dumps`` with every secret masked; raises what orjson raises."""
        data = orjson.dumps(obj, option=option)
        if self._needles and self.hit(data):
            data = orjson.dumps(self.value(obj), option=option)
        return data
