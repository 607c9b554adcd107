"""Numbers read from untrusted text take ASCII digits only.

``str.isdigit`` also passes "²" (which ``int()`` then refuses with a ValueError) and
``int()``/``float()``/``\\d`` also read "١٢" (Arabic-Indic) or "１２" (full width) as
12: a Host header ``localhost:²`` counted as localhost, a ``NO_PROXY`` or host list
entry with such a port crashed the parser, a frame's ``"seq": "١٢"`` was 12.
"""

from __future__ import annotations

from typing import Any

import pytest

from xwm_bridge import coerce
from xwm_bridge.adapters.agent_adapter import AdapterSettings
from xwm_bridge.config import ConfigError, ToolbridgeConfig
from xwm_bridge.gateway import protocol as gateway_protocol
from xwm_bridge.multiagent.protocol import parse_score
from xwm_bridge.netaddr import HostPolicy, parse_listen
from xwm_bridge.proxy import NoProxy
from xwm_bridge.toolbridge.vault import VaultCall
from xwm_bridge.transport.security import ServedHosts, host_name

UNICODE_DIGITS = ["²", "١٢", "１２", "٣"]


@pytest.mark.parametrize("port", UNICODE_DIGITS)
def test_a_host_header_port_takes_ascii_digits_only(port: str) -> None:
    assert host_name(f"localhost:{port}") == ""
    assert host_name(f"[::1]:{port}") == ""
    hosts = ServedHosts(True, "127.0.0.1", ())
    assert hosts.refuses(f"localhost:{port}")
    assert hosts.refuses(f"[::1]:{port}")


@pytest.mark.parametrize("port", UNICODE_DIGITS)
def test_a_listen_address_port_takes_ascii_digits_only(port: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_listen(f"127.0.0.1:{port}")


@pytest.mark.parametrize("port", UNICODE_DIGITS)
def test_a_host_list_entry_with_a_unicode_port_matches_nothing(port: str) -> None:
    # it crashed the parser ("²") or read as port 12; a bracketed one allowed any port
    policy = HostPolicy((f"gw.example:{port}", f"[2001:db8::1]:{port}", "[2001:db8::2]:x"))
    for p in (12, 443):
        assert not policy.allows("gw.example", p)
        assert not policy.allows("2001:db8::1", p)
        assert not policy.allows("2001:db8::2", p)


@pytest.mark.parametrize("port", UNICODE_DIGITS)
def test_a_no_proxy_entry_with_a_unicode_port_matches_nothing(port: str) -> None:
    matcher = NoProxy.parse(f"example.com:{port},[::1]:{port},a.example:x")
    for p in (12, 443):
        assert not matcher.bypass("example.com", p)
        assert not matcher.bypass("::1", p)
        assert not matcher.bypass("a.example", p)


@pytest.mark.parametrize("value", ["١٢", "１２", " ١٢ "])
def test_a_gateway_sequence_takes_ascii_digits_only(value: str) -> None:
    assert gateway_protocol.sequence(value) == 0


@pytest.mark.parametrize("value", ["١٢", "１２", " ٣abc"])
def test_a_positive_int_string_takes_ascii_digits_only(value: str) -> None:
    assert coerce.positive_int(value, 15) == 15


def test_a_review_score_takes_ascii_digits_only() -> None:
    assert parse_score("score: ٩") is None
    assert parse_score("٩/10") is None
    assert parse_score("score: 9") == 9.0


@pytest.mark.parametrize("cas", ["١٢", "１２"])
def test_a_vault_cas_takes_ascii_digits_only(cas: Any) -> None:
    vault = ToolbridgeConfig(vault_url="http://127.0.0.1:1", vault_token="t")
    assert VaultCall.parse(vault, {"operation": "get", "path": "a", "cas": cas}).cas is None


@pytest.mark.parametrize("version", ["١", "２"])
def test_the_adapter_protocol_version_takes_ascii_digits_only(version: str) -> None:
    with pytest.raises(ConfigError, match="GEMINI_ADAPTER_PROTOCOL_VERSION"):
        AdapterSettings.from_env({"GEMINI_ADAPTER_PROTOCOL_VERSION": version})
