"""xwm_bridge.netaddr: listen address parsing and the loopback test."""

from __future__ import annotations

import pytest

from xwm_bridge.netaddr import is_loopback_host, parse_listen


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("127.0.0.1:8787", ("127.0.0.1", 8787)),
        (" 0.0.0.0:0 ", ("0.0.0.0", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("[::1]:9000", ("::1", 9000)),
        ("[::]:80", ("::", 80)),
        (":8787", ("", 8787)),
    ],
)
def test_parse_listen(addr: str, expected: tuple[str, int]) -> None:
    assert parse_listen(addr) == expected


@pytest.mark.parametrize(
    "addr",
    [
        "",
        "8787",
        "host",
        "host:",
        "host:abc",
        "host:-1",
        "host:65536",
        "h:1.5",
        # a malformed host: these used to pass as a host named "[:" or "::1" and failed
        # only at bind time (or were refused as "non-loopback without a token")
        "[::1",
        "[::1:8787",
        "::1:8787",
        "[nothost]:80",
        "a b:80",
        "]:80",
    ],
)
def test_parse_listen_rejects(addr: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(addr)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.evil.com", False),
    ],
)
def test_is_loopback_host(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_host_policy() -> None:
    """issue 16 item 10: where a client may make the bridge dial."""
    from xwm_bridge.netaddr import HostPolicy, endpoint_of

    default = HostPolicy((), ("gw.example:443", "[2001:db8::1]:8443"))
    assert default.allows("127.0.0.1", 1) and default.allows("LOCALHOST", 65535)
    assert default.allows("[::1]", 2) and default.allows("127.1.2.3", 3)
    assert default.allows("gw.example", 443) and not default.allows("gw.example", 444)
    assert default.allows("2001:db8::1", 8443)
    assert not default.allows("10.0.0.1", 80) and not default.allows("0.0.0.0", 80)
    listed = HostPolicy(("gw.example", "10.0.0.1:22"))
    assert listed.allows("GW.example", 1) and listed.allows("10.0.0.1", 22)
    assert not listed.allows("10.0.0.1", 23) and not listed.allows("127.0.0.1", 1)
    assert HostPolicy(("*",)).allows("anything", 1)
    assert endpoint_of("wss://h.example/x") == "h.example:443"
    assert endpoint_of("http://[::1]:9/v1") == "[::1]:9"
    assert endpoint_of("not a url") == ""
