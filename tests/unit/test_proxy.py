"""xwm_bridge/proxy.py: the environment's proxies, the NO_PROXY matcher, CONNECT bytes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.config import ConfigError, load_config
from xwm_bridge.proxy import (
    ConnectAnswer,
    NoProxy,
    ProxyEnvError,
    ProxyRoute,
    ProxySettings,
    connect_request,
)


@pytest.mark.parametrize(
    ("entries", "host", "port", "bypass"),
    [
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),
        (".example.com", "example.com", 80, True),
        (".example.com", "a.b.example.com", 80, True),
        ("example.com", "badexample.com", 80, False),
        ("example.com", "example.com.evil.org", 80, False),
        ("EXAMPLE.com", "Example.COM.", 80, True),
        ("*", "anything.at.all", 1, True),
        ("a.org, *", "b.org", 1, True),
        ("example.com:8443", "example.com", 8443, True),
        ("example.com:8443", "example.com", 443, False),
        ("10.1.2.3", "10.1.2.3", 80, True),
        ("10.1.2.3", "10.1.2.4", 80, False),
        ("10.0.0.0/8", "10.200.3.4", 80, True),
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("::1", "::1", 80, True),
        ("[::1]", "[::1]", 80, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 80, False),
        ("fd00::/8", "fd12::1", 80, True),
        ("localhost", "127.0.0.1", 80, False),  # names never match addresses
        ("", "127.0.0.1", 80, False),  # loopback is not excluded implicitly
        ("a.org b.org", "b.org", 80, True),
        ("10.0.0.0/33,bogus/x", "10.0.0.1", 80, False),
    ],
)
def test_no_proxy_matcher(entries: str, host: str, port: int, bypass: bool) -> None:
    assert NoProxy.parse(entries).bypass(host, port) is bypass


# labels start with a letter: all-digit names would be IP literals, not domains
_label = st.from_regex(r"[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_name = st.lists(_label, min_size=1, max_size=4).map(".".join)


@given(_name, _name, st.booleans(), st.integers(1, 65535))
def test_a_listed_domain_covers_its_subdomains_and_nothing_else(
    domain: str, sub: str, dot: bool, port: int
) -> None:
    matcher = NoProxy.parse(("." if dot else "") + domain)
    assert matcher.bypass(domain, port)
    assert matcher.bypass(f"{sub}.{domain}", port)
    assert not matcher.bypass(f"{sub}x{domain}", port)  # a suffix, not a domain


def test_lower_case_wins_and_an_empty_lower_case_means_none() -> None:
    s = ProxySettings.from_env(
        {"http_proxy": "http://low:1", "HTTP_PROXY": "http://up:2", "HTTPS_PROXY": "up:3"}
    )
    assert s.http is not None and s.http.address == "low:1"
    assert s.https is not None and s.https.address == "up:3"  # no scheme: http://
    s = ProxySettings.from_env({"https_proxy": "", "HTTPS_PROXY": "http://up:2"})
    assert s.https is None and not s.active
    s = ProxySettings.from_env({"HTTP_PROXY": "http://p:1", "no_proxy": "a", "NO_PROXY": "*"})
    assert s.for_url("http://b/") is not None  # the lower-case "a" won over "*"


def test_the_scheme_picks_the_proxy_and_ws_follows_http() -> None:
    s = ProxySettings.from_env({"HTTP_PROXY": "http://h:1", "HTTPS_PROXY": "http://s:2"})
    routes = [s.for_url(u) for u in ("http://x", "ws://x", "https://x", "wss://x")]
    assert [r.address if r else "" for r in routes] == ["h:1", "h:1", "s:2", "s:2"]
    assert s.for_url("file:///etc/passwd") is None
    assert s.for_url("not a url") is None


def test_credentials_become_basic_auth_and_are_masked() -> None:
    route = ProxyRoute.parse("http://us%40er:p%3Ass@Proxy.example:3128", "HTTP_PROXY")
    assert route.authorization == "Basic dXNAZXI6cDpzcw=="  # base64("us@er:p:ss")
    assert route.display == "http://********@proxy.example:3128"
    assert route.url == "http://us%40er:p%3Ass@proxy.example:3128"
    assert "p%3Ass" not in repr(route) and "dXNA" not in repr(route)
    assert ProxyRoute.parse("proxy", "HTTP_PROXY").address == "proxy:80"
    assert ProxyRoute.parse("http://[::1]:3128", "HTTP_PROXY").address == "[::1]:3128"


@pytest.mark.parametrize(
    "value", ["socks5://u:secret@h:1080", "https://u:secret@h:443", "http://u:secret@h:1/path"]
)
def test_an_unusable_proxy_is_refused_without_its_credentials(value: str) -> None:
    with pytest.raises(ProxyEnvError) as info:
        ProxySettings.from_env({"HTTPS_PROXY": value})
    assert "HTTPS_PROXY" in str(info.value) and "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="HTTPS_PROXY"):
        load_config(env={"HTTPS_PROXY": value})


def test_load_config_resolves_the_proxies_of_its_environment() -> None:
    loaded = load_config(env={"HTTPS_PROXY": "http://p:8080", "NO_PROXY": ".internal"})
    assert loaded.proxies.describe("https://api.example.com") == "via http://p:8080"
    assert loaded.proxies.describe("https://vault.internal:8200") == "direct"
    assert not load_config(env={}).proxies.active


def test_connect_request_and_answer() -> None:
    route = ProxyRoute.parse("http://u:p@proxy:3128", "HTTPS_PROXY")
    assert connect_request(route, "::1", 443) == (
        b"CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
    )
    answer = ConnectAnswer()
    assert not answer.feed(b"HTTP/1.1 407 Proxy Auth")
    assert answer.feed(b"entication Required\r\nX: y\r\n\r\n")
    assert answer.status == 407 and answer.rest == b""
    with pytest.raises(ValueError, match="not an HTTP answer"):
        ConnectAnswer().feed(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ValueError, match="too long"):
        ConnectAnswer().feed(b"HTTP/1.1 200 OK\r\n" + b"X" * 20000)


def test_the_proxy_credentials_are_secrets_of_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy URL with user:password@ is a credential: a client library's error text that
    quotes it (or its Basic token) must not reach a log line (cli/common.py log_secrets)."""
    import base64
    import logging

    from xwm_bridge.cli.common import log_secrets
    from xwm_bridge.config import BridgeConfig
    from xwm_bridge.observability import logging as obslog

    settings = ProxySettings.from_env({"HTTPS_PROXY": "http://me:p%40ss-w0rd@proxy:3128"})
    token = base64.b64encode(b"me:p@ss-w0rd").decode()
    assert {"p@ss-w0rd", "p%40ss-w0rd", token} <= set(settings.secrets())
    assert ProxySettings.from_env({"HTTP_PROXY": "http://proxy:3128"}).secrets() == ()

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://me:p%40ss-w0rd@proxy:3128")
    lines: list[bytes] = []
    sink = obslog.setup_logging("info", log_secrets(BridgeConfig()), write=lines.append)
    try:
        logging.getLogger("xwm_bridge.t").warning(
            "dial failed", extra={"error": f"via http://me:p%40ss-w0rd@proxy:3128 ({token})"}
        )
        sink.flush()
    finally:
        obslog.setup_logging("info", write=lambda _: None)
        logging.getLogger().handlers[:] = []
        obslog.events.configure(None, obslog.Redactor(), logging.INFO)
    text = b"".join(lines).decode()
    assert "dial failed" in text
    assert "ss-w0rd" not in text and token not in text
