"""Outbound proxies from the bridge's own environment (config.md §2.1): which proxy, if
any, a URL goes through. Sans-I/O: the CONNECT request and its answer are bytes here;
the sockets are the clients' (``providers/http1_pool.py``, ``proxy_aiohttp.py``,
the WebSocket dials).

Read once at start-up (:meth:`ProxySettings.from_env`), never from a client's input:

- ``http_proxy`` / ``HTTP_PROXY`` for ``http://`` and ``ws://`` targets,
  ``https_proxy`` / ``HTTPS_PROXY`` for ``https://`` and ``wss://``; the lower-case
  name wins when both are set (an empty lower-case value means no proxy), as in
  curl and requests. ``ALL_PROXY`` is not read.
- a proxy is ``http://[user:password@]host[:port]`` (no scheme means ``http://``; the
  port defaults to 80); credentials become ``Proxy-Authorization: Basic``. Other
  schemes (``https://``, ``socks5://``) are refused at start-up.
- ``no_proxy`` / ``NO_PROXY``: a comma (or space) separated list of ``*`` (no proxy
  at all), host names (``example.com`` and ``.example.com`` both match the name and
  every name under it), ``host:port``, IP literals (``10.1.2.3``, ``::1``,
  ``[::1]:8080``) and CIDR blocks (``10.0.0.0/8``). Case-insensitive. Loopback
  addresses are *not* excluded unless listed.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiohttp
from websockets.exceptions import InvalidProxyStatus, ProxyError
from yarl import URL

__all__ = [
    "ConnectAnswer",
    "NoProxy",
    "ProxyEnvError",
    "ProxyRoute",
    "ProxySettings",
    "aiohttp_session_options",
    "connect_request",
    "ws_error",
]

MASK = "********"
#: a CONNECT answer's head may not be longer than this
MAX_CONNECT_HEAD = 16 * 1024
_IPNet = ipaddress.IPv4Network | ipaddress.IPv6Network


class ProxyEnvError(ValueError):
    """A proxy variable that cannot be used (its text never repeats a credential)."""


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """One proxy: where to connect, and what to tell it."""

    host: str
    port: int
    #: the ``Proxy-Authorization`` value, or ``""``
    authorization: str = field(default="", repr=False)
    #: the URL with its credentials, for clients that take one (websockets)
    url: str = field(default="", repr=False)

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def display(self) -> str:
        """For logs, ``doctor`` and the health view: credentials masked."""
        return f"http://{MASK + '@' if self.authorization else ''}{self.address}"

    @property
    def plain_url(self) -> str:
        """The URL without its credentials (those go in :attr:`authorization`)."""
        return f"http://{self.address}"

    def refused(self, status: int) -> str:
        return f"proxy {self.address} refused CONNECT: {status}"

    def unreachable(self, reason: str) -> str:
        return f"cannot connect to proxy {self.address}: {reason}"

    @classmethod
    def parse(cls, value: str, name: str) -> ProxyRoute:
        raw = value.strip()
        if "://" not in raw:
            raw = "http://" + raw
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError:
            raise ProxyEnvError(f"{name}: not a proxy URL") from None
        if parts.scheme.lower() != "http":
            raise ProxyEnvError(
                f"{name}: unsupported proxy scheme {parts.scheme!r} (only http:// proxies)"
            )
        if not parts.hostname or parts.path not in ("", "/") or parts.query:
            raise ProxyEnvError(f"{name}: a proxy URL is http://[user:password@]host[:port]")
        host = parts.hostname.lower()
        address = f"[{host}]" if ":" in host else host
        address = f"{address}:{port or 80}"
        authorization, url = "", f"http://{address}"
        if parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            authorization = f"Basic {token}"
            url = f"http://{quote(user, safe='')}:{quote(password, safe='')}@{address}"
        return cls(host, port or 80, authorization, url)


def _host_of(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare v6 literal; an entry
    whose port is not ASCII digits stays whole (it matches no host, not every port)."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if not rest:
            return host, None
        port = rest[1:] if rest.startswith(":") else ""
        return (host, int(port)) if port.isascii() and port.isdigit() else (entry, None)
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return (host, int(port)) if port.isascii() and port.isdigit() else (entry, None)
    return entry, None


@dataclass(frozen=True, slots=True)
class NoProxy:
    """The parsed ``NO_PROXY`` list."""

    everything: bool = False
    #: (name without a leading dot, port or None)
    names: tuple[tuple[str, int | None], ...] = ()
    nets: tuple[_IPNet, ...] = ()
    #: (address, port or None)
    addresses: tuple[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int | None], ...] = ()

    @classmethod
    def parse(cls, value: str) -> NoProxy:
        names: list[tuple[str, int | None]] = []
        nets: list[_IPNet] = []
        addresses: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int | None]] = []
        for raw in value.replace(" ", ",").split(","):
            entry = raw.strip().lower()
            if not entry:
                continue
            if entry == "*":
                return cls(everything=True)
            if "/" in entry:
                # not a block: it cannot match a host name either
                with contextlib.suppress(ValueError):
                    nets.append(ipaddress.ip_network(entry, strict=False))
                continue
            host, port = _host_of(entry)
            try:
                addresses.append((ipaddress.ip_address(host), port))
            except ValueError:
                name = host.lstrip(".").rstrip(".")
                if name.startswith("*."):
                    name = name[2:]
                if name:
                    names.append((name, port))
        return cls(False, tuple(names), tuple(nets), tuple(addresses))

    def bypass(self, host: str, port: int) -> bool:
        """Whether ``host`` (a name or an IP literal, without brackets) goes direct."""
        if self.everything:
            return True
        host = host.strip("[]").lower().rstrip(".")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            for name, want in self.names:
                if want is not None and want != port:
                    continue
                if host == name or host.endswith("." + name):
                    return True
            return False
        for addr, want in self.addresses:
            if addr == ip and (want is None or want == port):
                return True
        return any(ip in net for net in self.nets)


def _pick(env: Mapping[str, str], lower: str) -> tuple[str, str]:
    """(value, name): the lower-case variable if set (even empty), else the upper-case."""
    if lower in env:
        return env[lower], lower
    upper = lower.upper()
    return env.get(upper, ""), upper


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Which proxy applies to which URL; the default is none at all."""

    http: ProxyRoute | None = None
    https: ProxyRoute | None = None
    no_proxy: NoProxy = field(default_factory=NoProxy)
    #: the ``NO_PROXY`` text as given (for ``doctor``)
    no_proxy_text: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ProxySettings:
        routes: dict[str, ProxyRoute | None] = {}
        for scheme in ("http", "https"):
            value, name = _pick(env, f"{scheme}_proxy")
            routes[scheme] = ProxyRoute.parse(value, name) if value.strip() else None
        text, _ = _pick(env, "no_proxy")
        return cls(routes["http"], routes["https"], NoProxy.parse(text), text.strip())

    @property
    def active(self) -> bool:
        return self.http is not None or self.https is not None

    def route(self, secure: bool, host: str, port: int) -> ProxyRoute | None:
        route = self.https if secure else self.http
        if route is None or self.no_proxy.bypass(host, port):
            return None
        return route

    def for_url(self, url: str) -> ProxyRoute | None:
        """The proxy for an ``http(s)://`` or ``ws(s)://`` URL, or None (direct)."""
        if not self.active:
            return None
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
            return None
        secure = scheme in ("https", "wss")
        return self.route(secure, parts.hostname, port or (443 if secure else 80))

    def describe(self, url: str) -> str:
        """``doctor``'s column: ``direct`` or the proxy, credentials masked."""
        route = self.for_url(url)
        return "direct" if route is None else f"via {route.display}"

    def secrets(self) -> tuple[str, ...]:
        """What of the proxy credentials a log line must never show: each password, the
        ``Proxy-Authorization`` token and the URL that carries them (the log redactor's)."""
        out: list[str] = []
        for route in (self.http, self.https):
            if route is None or not route.authorization:
                continue
            token = route.authorization.removeprefix("Basic ")
            _, _, password = base64.b64decode(token).decode().partition(":")
            out += [route.url, token, password, quote(password, safe="")]
        return tuple(dict.fromkeys(x for x in out if x))

    def summary(self) -> dict[str, str]:
        """The settings for ``doctor`` and the health view (credentials masked)."""
        return {
            "http": self.http.display if self.http else "",
            "https": self.https.display if self.https else "",
            "no_proxy": self.no_proxy_text,
        }


def connect_request(route: ProxyRoute, host: str, port: int) -> bytes:
    """``CONNECT host:port`` for a tunnel through ``route``."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if route.authorization:
        lines.append(f"Proxy-Authorization: {route.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class ConnectAnswer:
    """The proxy's answer to CONNECT, fed as it arrives: :attr:`status` once its head
    is complete (then :attr:`rest` holds any bytes after it), ``ValueError`` for an
    answer that is not HTTP or too long."""

    def __init__(self) -> None:
        self._buf = b""
        self.status: int | None = None
        self.rest = b""

    def feed(self, data: bytes) -> bool:
        """True once the head is complete."""
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_CONNECT_HEAD:
                raise ValueError("proxy answer too long")
            return False
        head, self.rest = self._buf[:end], self._buf[end + 4 :]
        line = head.split(b"\r\n", 1)[0].split(b" ", 2)
        if len(line) < 2 or not line[0].startswith(b"HTTP/1.") or not line[1].isdigit():
            raise ValueError("not an HTTP answer")
        self.status = int(line[1])
        return True


def ws_error(exc: BaseException, route: ProxyRoute | None) -> str:
    """A failed WebSocket dial (websockets) in words; through a proxy, the proxy's part
    named by its address, never its credentials (the proxy URL is not repeated)."""
    text = str(exc).strip() or type(exc).__name__
    if route is None:
        return text
    if isinstance(exc, InvalidProxyStatus):
        return route.refused(exc.response.status_code)
    if isinstance(exc, ProxyError):
        return f"proxy {route.address}: {text}"
    if isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError):
        return route.unreachable(exc.strerror or text)
    return text


def aiohttp_session_options(settings: ProxySettings) -> dict[str, Any]:
    """Keyword arguments for an ``aiohttp.ClientSession`` that honours ``settings``:
    never aiohttp's own reading of the environment (``trust_env`` also reads
    ``~/.netrc`` and has urllib's ``NO_PROXY`` rules), and, when a proxy is set at all,
    a middleware that picks each request's proxy by :meth:`ProxySettings.route` (no
    middleware, so no cost, when none is)."""
    if not settings.active:
        return {"trust_env": False}

    async def choose_proxy(
        req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        url = req.url
        secure = url.scheme in ("https", "wss")
        route = settings.route(secure, url.host or "", url.port or (443 if secure else 80))
        if route is None:
            req.update_proxy(None, None, None)
            return await handler(req)
        # as proxy_auth: aiohttp sends it on CONNECT, and on an absolute-form request
        auth = aiohttp.BasicAuth.decode(route.authorization) if route.authorization else None
        req.update_proxy(URL(route.plain_url), auth, None)
        try:
            return await handler(req)
        except aiohttp.ClientHttpProxyError as exc:
            raise aiohttp.ClientConnectionError(route.refused(exc.status)) from None
        except aiohttp.ClientProxyConnectionError as exc:
            reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
            raise aiohttp.ClientConnectionError(route.unreachable(reason)) from None

    return {"trust_env": False, "middlewares": (choose_proxy,)}
