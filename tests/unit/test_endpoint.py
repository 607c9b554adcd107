"""xwm_bridge.endpoint.derive_endpoint (forwarding.md §4.3)."""

from __future__ import annotations

import pytest

from xwm_bridge.endpoint import Endpoint, EndpointError, derive_endpoint


@pytest.mark.parametrize(
    ("configured", "transport", "url"),
    [
        # the table of forwarding.md §4.3, row by row
        (
            "https://acp-server.svc.plus/codex/acp/rpc",
            "http",
            "https://acp-server.svc.plus/codex/acp/rpc",
        ),
        ("https://host", "http", "https://host/acp/rpc"),
        ("http://127.0.0.1:8791/", "http", "http://127.0.0.1:8791/acp/rpc"),
        ("wss://host/gemini/acp", "ws", "wss://host/gemini/acp"),
        ("ws://127.0.0.1:9010/acp/rpc", "ws", "ws://127.0.0.1:9010/acp"),
    ],
)
def test_spec_table(configured: str, transport: str, url: str) -> None:
    ep = derive_endpoint(configured)
    assert ep.transport == transport
    assert ep.url == url


@pytest.mark.parametrize(
    ("configured", "http_url", "ws_url"),
    [
        ("https://h/codex/acp/rpc", "https://h/codex/acp/rpc", "wss://h/codex/acp"),
        ("https://h/codex/acp/rpc/", "https://h/codex/acp/rpc", "wss://h/codex/acp"),
        ("https://h/codex/acp", "https://h/codex/acp/rpc", "wss://h/codex/acp"),
        ("https://h/codex/", "https://h/codex/acp/rpc", "wss://h/codex/acp"),
        ("http://h/", "http://h/acp/rpc", "ws://h/acp"),
        ("http://h//", "http://h/acp/rpc", "ws://h/acp"),
        ("ws://h:1/acp", "http://h:1/acp/rpc", "ws://h:1/acp"),
        ("wss://h/a/b/acp/rpc", "https://h/a/b/acp/rpc", "wss://h/a/b/acp"),
        # only one suffix is removed
        ("https://h/acp/rpc/acp/rpc", "https://h/acp/rpc/acp/rpc", "wss://h/acp/rpc/acp"),
        ("https://h/acp/acp", "https://h/acp/acp/rpc", "wss://h/acp/acp"),
        # query, fragment and user-info are dropped
        ("https://user:pw@h:8443/x?q=1#frag", "https://h:8443/x/acp/rpc", "wss://h:8443/x/acp"),
        # the scheme is case-insensitive
        ("HTTPS://h/x", "https://h/x/acp/rpc", "wss://h/x/acp"),
        # IPv6 literal keeps its brackets
        ("http://[::1]:9000/acp/rpc", "http://[::1]:9000/acp/rpc", "ws://[::1]:9000/acp"),
        ("  https://h/p  ", "https://h/p/acp/rpc", "wss://h/p/acp"),
    ],
)
def test_both_urls(configured: str, http_url: str, ws_url: str) -> None:
    ep = derive_endpoint(configured)
    assert ep.http_url == http_url
    assert ep.ws_url == ws_url


def test_transport_by_scheme() -> None:
    assert derive_endpoint("http://h").transport == "http"
    assert derive_endpoint("https://h").transport == "http"
    assert derive_endpoint("ws://h").transport == "ws"
    assert derive_endpoint("wss://h").transport == "ws"
    assert derive_endpoint("WSS://h").transport == "ws"


def test_url_property_follows_transport() -> None:
    ep = Endpoint(transport="ws", http_url="http://a/acp/rpc", ws_url="ws://a/acp")
    assert ep.url == "ws://a/acp"
    ep = Endpoint(transport="http", http_url="http://a/acp/rpc", ws_url="ws://a/acp")
    assert ep.url == "http://a/acp/rpc"


@pytest.mark.parametrize("blank", ["", "   ", "\n"])
def test_blank_endpoint(blank: str) -> None:
    with pytest.raises(EndpointError) as info:
        derive_endpoint(blank)
    assert str(info.value) == "missing external ACP endpoint"


@pytest.mark.parametrize(
    ("configured", "scheme"),
    [("ftp://host/x", "ftp"), ("FILE://host/x", "file"), ("grpc://h:1", "grpc")],
)
def test_unsupported_scheme(configured: str, scheme: str) -> None:
    with pytest.raises(EndpointError) as info:
        derive_endpoint(configured)
    assert str(info.value) == f"unsupported external ACP scheme: {scheme}"


@pytest.mark.parametrize("configured", ["host/acp", "/just/a/path", "http://", "https:///x"])
def test_not_absolute(configured: str) -> None:
    with pytest.raises(EndpointError):
        derive_endpoint(configured)


@pytest.mark.parametrize("configured", ["http://h:notaport/x", "http://h:99999/", "http://[::1/"])
def test_unparsable(configured: str) -> None:
    with pytest.raises(EndpointError):
        derive_endpoint(configured)


def test_endpoint_error_is_value_error() -> None:
    assert issubclass(EndpointError, ValueError)
