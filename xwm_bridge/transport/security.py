"""Origin allow-list, bearer authentication, served ``Host`` names and bind policy
(contract.md §3).

Fixes of the original: tokens compared in constant time; origin rules are
parsed (scheme + host exact, ``:*`` = any port) instead of string prefixes; a
bridge without a token answers only its own ``Host`` names (DNS rebinding).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from xwm_bridge.core import principals

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: :meth:`BearerAuth.verify` reasons (also the ``reason`` label of rejected requests)
MISSING = "missing_token"
INVALID = "invalid_token"
#: 401 messages: one for a missing and a wrong token, as the original (contract.md §3.3:
#: clients match on it); the reason is told apart in the log line and the metric's label
AUTH_MESSAGES = {MISSING: "missing bearer authorization", INVALID: "missing bearer authorization"}


@dataclass(frozen=True, slots=True)
class OriginRule:
    scheme: str
    host: str
    port: int | None  # None = any port

    @classmethod
    def parse(cls, entry: str) -> OriginRule | None:
        text = entry.strip()
        any_port = text.endswith(":*")
        if any_port:
            text = text[:-2]
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            return None
        scheme = parts.scheme.lower()
        if not scheme or not parts.hostname:
            return None
        if any_port:
            return cls(scheme, parts.hostname.lower(), None)
        return cls(scheme, parts.hostname.lower(), port or _DEFAULT_PORTS.get(scheme))

    def matches(self, scheme: str, host: str, port: int | None) -> bool:
        if scheme != self.scheme or host != self.host:
            return False
        return self.port is None or self.port == port


class OriginPolicy:
    def __init__(self, entries: tuple[str, ...]) -> None:
        self.rules = tuple(r for r in (OriginRule.parse(e) for e in entries) if r is not None)

    def allows(self, origin: str | None) -> bool:
        value = (origin or "").strip()
        if not value:
            return True  # non-browser clients send no Origin
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            return False
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            return False
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        if not scheme or not host:
            return False
        port = port or _DEFAULT_PORTS.get(scheme)
        return any(rule.matches(scheme, host, port) for rule in self.rules)


class BearerAuth:
    """contract.md §3.3, with a constant-time comparison of every request's credential
    against every token (no cache of accepted values: measured at about 1 µs per
    request, not worth a lookup whose timing depends on the credential)."""

    def __init__(self, token: str, extra: tuple[str, ...] = ()) -> None:
        #: every accepted token; empty = any non-empty bearer (loopback only)
        self._tokens = [t.strip().encode() for t in (token, *extra) if t.strip()]

    @property
    def required(self) -> bool:
        """A token is configured (else any non-empty bearer passes: loopback only)."""
        return bool(self._tokens)

    def check(self, header: str | None) -> bool:
        return not self.verify(header)

    def verify(self, header: str | None) -> str:
        """ "" when accepted, else why not: :data:`MISSING` (no credential sent) or
        :data:`INVALID` (a credential that matches no token)."""
        value = (header or "").strip()
        if not value:
            return MISSING
        credential: str | None = None
        if value[:7].lower() == "bearer " or value.lower() == "bearer":
            credential = value[7:].strip()
        if not self._tokens:
            return "" if credential else MISSING  # any bearer; a bare value is none
        # the raw value too (contract.md §3.3: a header equal to the token passes, even
        # a token that reads "Bearer"), then the credential after the scheme
        candidates = [value.encode()]
        if credential:
            candidates.append(credential.encode())
        ok = False
        for candidate in candidates:
            for token in self._tokens:
                ok |= hmac.compare_digest(candidate, token)
        if ok:
            return ""
        return MISSING if credential == "" else INVALID  # "Bearer" alone sends none


#: the longest header value :class:`ServedHosts` and :class:`PrincipalCache` remember
#: (their entries are counted, and a field can be 8 KiB: a few MiB otherwise)
MAX_KEPT_CHARS = 256


class ServedHosts:
    """The ``Host`` names a bridge that requires no token answers (DNS rebinding).

    Without a token any bearer passes, so the only thing between a web page and the
    bridge is the browser's same-origin rule. A page on ``evil.example`` whose name
    is rebound to 127.0.0.1 is same-origin with the bridge: its GETs carry no
    ``Origin``, but every request names ``Host: evil.example[:port]``. Answered:
    no ``Host`` (not a browser), IP literals (a rebinding needs a name),
    ``localhost`` and ``*.localhost``, the listen host and ``allowed_hosts``
    (names, any port; ``*`` = any). ``active`` is False when a token is required
    (proxies forward any public name; the token is the check) or with ``*``.
    Accepted header values are remembered, so a request costs one set lookup.
    """

    MAX_SEEN = 256

    def __init__(self, active: bool, listen_host: str, allowed: tuple[str, ...]) -> None:
        names = {_bare(n) for n in (listen_host, *allowed) if n.strip()}
        self.active = active and "*" not in names
        self._names = frozenset(names)
        self._seen: set[str] = set()

    def refuses(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header value is refused (421)."""
        if not self.active or not host or host in self._seen:
            return False
        if not self._allowed(host):
            return True
        if len(host) <= MAX_KEPT_CHARS:  # a longer one is checked again next time
            if len(self._seen) >= self.MAX_SEEN:
                self._seen.clear()
            self._seen.add(host)
        return False

    def _allowed(self, host: str) -> bool:
        name = _bare(host_name(host))
        if not name:
            return False
        if name in self._names or name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True


def host_name(host: str) -> str:
    """The name of a ``Host`` value: ``name[:port]`` or ``[v6][:port]``; "" if malformed."""
    value = host.strip()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        return name if not rest or (rest[0] == ":" and _port(rest[1:])) else ""
    if value.count(":") == 1:
        name, _, port = value.partition(":")
        return name if _port(port) else ""
    return value


def _port(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also passes "²" and "١٢"."""
    return text.isascii() and text.isdigit()


def _bare(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


#: how much of a refused ``Origin`` (up to 8190 bytes) its 403 and its log line repeat
ORIGIN_SHOWN = 200


def origin_refused(origin: str) -> str:
    """The 403 message for a refused ``Origin`` (contract.md §3.1), the value cut."""
    return f"origin not allowed: {origin[:ORIGIN_SHOWN]}"


def principal_of(header: str | None) -> tuple[str, str]:
    """(principal, bare credential) of an accepted ``Authorization`` value.

    The principal is a digest, so runtimes and sessions can be keyed and logged
    by it without holding the credential itself (core/principals.py).
    """
    return principals.principal_of(header)


class PrincipalCache:
    """:func:`principal_of` with the digests of recent headers kept (one SHA-256 per
    distinct credential, not per request). Bounded: cleared when it fills up, and a
    header longer than :data:`MAX_KEPT_CHARS` is digested each time, not kept (with no
    token configured any bearer passes, and a field can be 8 KiB)."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._max = max_entries
        self._known: dict[str | None, tuple[str, str]] = {}

    def of(self, header: str | None) -> tuple[str, str]:
        hit = self._known.get(header)
        if hit is None:
            hit = principal_of(header)
            if header is None or len(header) <= MAX_KEPT_CHARS:
                if len(self._known) >= self._max:
                    self._known.clear()
                self._known[header] = hit
        return hit


def peer_of(request: Any) -> str:
    """``host:port`` of the TCP peer (a proxy in front shows as itself)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return request.remote or ""
