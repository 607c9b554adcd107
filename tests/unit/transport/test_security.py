"""xwm_bridge.transport.security: origin policy, bearer auth, served hosts, listen parsing
(contract.md §3)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from xwm_bridge.config import DEFAULT_ALLOWED_ORIGINS
from xwm_bridge.transport.security import (
    INVALID,
    MISSING,
    BearerAuth,
    OriginPolicy,
    OriginRule,
    PrincipalCache,
    ServedHosts,
    host_name,
    principal_of,
)

PROPS = settings(max_examples=200, deadline=None)
DEFAULT = OriginPolicy(DEFAULT_ALLOWED_ORIGINS)


# --- origin policy --------------------------------------------------------------------


@pytest.mark.parametrize("origin", [None, "", "   ", "\t"])
def test_empty_origin_is_allowed(origin: str | None) -> None:
    assert DEFAULT.allows(origin)
    assert OriginPolicy(()).allows(origin)


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://xworkmate.svc.plus", True),
        ("  https://xworkmate.svc.plus  ", True),
        ("https://xworkmate.svc.plus:443", True),  # default port normalized
        ("https://XWORKMATE.svc.plus", True),  # host names are case-insensitive
        ("HTTPS://xworkmate.svc.plus", True),
        ("https://xworkmate.svc.plus:8443", False),
        ("http://xworkmate.svc.plus", False),
        ("https://evil.xworkmate.svc.plus", False),
        ("https://xworkmate.svc.plus.evil.com", False),
        ("http://localhost:3000", True),
        ("http://localhost:1", True),
        ("http://localhost:65535", True),
        ("http://localhost", True),  # `:*` means any port, the default one included
        ("http://localhost:80", True),
        ("http://LOCALHOST:5173", True),
        ("http://localhost:evil", False),
        ("http://localhost:3000evil", False),
        ("http://localhost.evil.com:80", False),
        ("http://localhost.evil.com", False),
        ("http://localhostevil:80", False),
        ("https://localhost:3000", False),
        ("ws://localhost:3000", False),
        ("http://127.0.0.1:8080", True),
        ("http://127.0.0.1", True),
        ("http://127.0.0.2:8080", False),
        ("http://127.0.0.1.evil.com:8080", False),
        ("http://[::1]:3000", False),
        # garbage and non-origin shapes
        ("null", False),
        ("localhost:3000", False),
        ("http://", False),
        ("http://:3000", False),
        ("*", False),
        ("http://localhost:99999", False),
        ("http://[::1", False),
        ("http://localhost:3000/path", False),
        ("http://localhost:3000?q=1", False),
        ("http://localhost:3000#f", False),
        ("http://user@localhost:3000", False),
        ("http://user:pw@localhost:3000", False),
        ("file://", False),
    ],
)
def test_default_policy(origin: str, allowed: bool) -> None:
    assert DEFAULT.allows(origin) is allowed


def test_exact_entries_with_explicit_port() -> None:
    policy = OriginPolicy(("http://app.example:8080", "https://secure.example"))
    assert policy.allows("http://app.example:8080")
    assert not policy.allows("http://app.example")
    assert not policy.allows("http://app.example:8081")
    assert policy.allows("https://secure.example")
    assert policy.allows("https://secure.example:443")
    assert not policy.allows("https://secure.example:444")


def test_default_port_normalization_in_entry() -> None:
    policy = OriginPolicy(("http://app.example:80", "https://s.example:443"))
    assert policy.allows("http://app.example")
    assert policy.allows("https://s.example")
    assert not policy.allows("https://app.example")


def test_ipv6_entries() -> None:
    policy = OriginPolicy(("http://[::1]:*",))
    assert policy.allows("http://[::1]:3000")
    assert policy.allows("http://[::1]")
    assert not policy.allows("http://[::2]:3000")


def test_empty_policy_denies_every_browser_origin() -> None:
    assert not OriginPolicy(()).allows("http://localhost:3000")


@pytest.mark.parametrize("entry", ["garbage", "", "*", ":*", "http://", "https://a:99999", "a.b"])
def test_unparsable_entries_are_dropped(entry: str) -> None:
    assert OriginRule.parse(entry) is None
    policy = OriginPolicy((entry, "https://ok.example"))
    assert len(policy.rules) == 1
    assert policy.allows("https://ok.example")


def test_rule_parse() -> None:
    assert OriginRule.parse("http://localhost:*") == OriginRule("http", "localhost", None)
    assert OriginRule.parse(" HTTPS://Example.COM ") == OriginRule("https", "example.com", 443)
    assert OriginRule.parse("http://x:8080") == OriginRule("http", "x", 8080)
    assert OriginRule.parse("custom://x") == OriginRule("custom", "x", None)


@PROPS
@given(st.text(max_size=60))
def test_random_origins_never_raise(origin: str) -> None:
    assert isinstance(DEFAULT.allows(origin), bool)


@PROPS
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-:/0123456789", max_size=30))
def test_localhost_wildcard_only_admits_localhost(suffix: str) -> None:
    origin = "http://localhost" + suffix
    if DEFAULT.allows(origin):
        rest = suffix.removesuffix("/")  # an empty path is tolerated
        assert rest == "" or rest.startswith(":")
        port = rest[1:]
        assert port == "" or port.isdigit()


# --- bearer auth (contract.md §3.3 table, with the rewrite's constant-time compare) ----


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("tok", True),  # raw token without scheme
        ("  tok  ", True),
        ("Bearer tok", True),
        ("bearer tok", True),
        ("BEARER tok", True),
        ("Bearer   tok  ", True),
        ("Bearer wrong", False),
        ("wrong", False),
        ("tok2", False),
        ("Bearer tok2", False),
        ("Bearer  ", False),
        ("Basic x", False),
        ("Basic tok", False),
        ("Bearertok", False),
        ("Bearer\ttok", False),
        ("", False),
        ("   ", False),
        (None, False),
    ],
)
def test_with_token(header: str | None, ok: bool) -> None:
    assert BearerAuth("tok").check(header) is ok


def test_configured_token_is_trimmed() -> None:
    assert BearerAuth("  tok \n").check("Bearer tok")


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("Bearer anything", True),
        ("bearer x", True),
        ("BEARER   spaced  ", True),
        ("Bearer   ", False),
        ("Bearer", False),
        ("Basic x", False),
        ("rawtoken", False),
        ("", False),
        (None, False),
    ],
)
def test_without_token(header: str | None, ok: bool) -> None:
    assert BearerAuth("").check(header) is ok
    assert BearerAuth("   ").check(header) is ok


@PROPS
@given(st.text(max_size=30), st.text(max_size=30))
@example(token="bearer", header="bearer")  # once found by this test: see below
def test_only_the_token_is_accepted(token: str, header: str) -> None:
    auth = BearerAuth(token)
    expected_token = token.strip()
    value = header.strip()
    ok = auth.check(header)
    if expected_token:
        credential = value[7:].strip() if value[:7].lower() == "bearer " else None
        assert ok == (bool(value) and (value == expected_token or credential == expected_token))
    else:
        assert ok == (value[:7].lower() == "bearer " and bool(value[7:].strip()))


# --- served Host names (DNS rebinding) --------------------------------------------------


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("127.0.0.1:8787", "127.0.0.1"),
        ("[::1]:8787", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("evil.example", "evil.example"),
        ("evil.example:80", "evil.example"),
        ("evil.example:x", ""),
        ("[::1]x", ""),
        ("[::1]:", ""),
    ],
)
def test_host_name(host: str, name: str) -> None:
    assert host_name(host) == name


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        (None, False),  # HTTP/1.0 without Host: not a browser
        ("", False),
        ("127.0.0.1:8787", False),
        ("127.8.9.1", False),
        ("[::1]:8787", False),
        ("192.168.1.5:8787", False),  # an IP literal cannot be a rebound name
        ("localhost:8787", False),
        ("LocalHost.", False),
        ("app.localhost:3000", False),
        ("bridge.lan:9", False),  # allowed_hosts, any port
        ("my-box", False),  # the listen host
        ("evil.example:8787", True),
        ("evil.example", True),
        ("localhost.evil.example", True),
        ("127.0.0.1.evil.example", True),
        ("bridge.lan.evil.example", True),
        ("evil.example:8787:1", True),
        ("[evil.example]:8787", True),
    ],
)
def test_served_hosts(host: str | None, refused: bool) -> None:
    hosts = ServedHosts(True, "my-box", ("Bridge.LAN",))
    assert hosts.refuses(host) is refused
    assert hosts.refuses(host) is refused  # the same answer from the cache


def test_served_hosts_inactive_with_a_token_or_a_wildcard() -> None:
    assert not ServedHosts(False, "127.0.0.1", ()).refuses("evil.example")
    assert not ServedHosts(False, "127.0.0.1", ()).active
    assert not ServedHosts(True, "127.0.0.1", ("*",)).refuses("evil.example")


def test_served_hosts_cache_is_bounded() -> None:
    hosts = ServedHosts(True, "", ())
    for port in range(ServedHosts.MAX_SEEN * 3):
        assert not hosts.refuses(f"127.0.0.1:{port}")
    assert len(hosts._seen) <= ServedHosts.MAX_SEEN
    assert hosts.refuses("evil.example")


def test_served_hosts_keep_only_short_values() -> None:
    # accepted names can be as long as a header field (8 KiB): counted entries alone
    # would let 256 of them hold 2 MiB
    hosts = ServedHosts(True, "", ())
    long_names = [f"{'a' * 60}.{i:04d}.{'b' * 6000}.localhost" for i in range(64)]
    for name in long_names:
        assert not hosts.refuses(name)
        assert not hosts.refuses(name)  # the same answer, checked again
    assert not hosts._seen
    assert hosts.refuses("x" * 6000 + ".evil.example")
    assert not hosts.refuses("bridge.localhost")
    assert "bridge.localhost" in hosts._seen


def test_principal_cache_keeps_only_short_headers() -> None:
    cache = PrincipalCache()
    for i in range(64):
        header = f"Bearer {i:04d}{'t' * 7000}"
        assert cache.of(header) == principal_of(header)
        assert cache.of(header) == principal_of(header)
    assert not cache._known
    assert cache.of("Bearer short") == principal_of("Bearer short")
    assert list(cache._known) == ["Bearer short"]


def test_a_header_equal_to_the_token_passes_even_when_it_reads_bearer() -> None:
    # contract.md §3.3: "equals the token exactly (raw token without scheme)" is
    # accepted; a token "Bearer" was refused as a scheme with no credential
    auth = BearerAuth("Bearer")
    assert auth.check("Bearer")
    assert auth.check(" bearer ") is False  # exactly: the case is the token's
    assert auth.verify("bearer") == MISSING  # a lone scheme still reads as none sent
    assert BearerAuth("tok").verify("Bearer") == MISSING
    assert BearerAuth("tok").verify("Bearer   ") == MISSING
    assert BearerAuth("tok").verify("Bearer nope") == INVALID
    assert BearerAuth("tok").check("Bearer tok") and BearerAuth("tok").check("tok")
