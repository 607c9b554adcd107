"""Connect params at the boundary and the ``openclaw`` override (no sockets)."""

from __future__ import annotations

import dataclasses

import pytest

from xwm_bridge.config import BridgeConfig, GatewayConfig
from xwm_bridge.gateway.connect_params import ConnectParams, build_connect_config
from xwm_bridge.gateway.errors import GatewayError
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

CLIENT = {
    "runtimeId": " rt ",
    "gatewayProviderId": "local",
    "clientId": "app",
    "endpoint": {"host": "gw.example", "port": "18789", "tls": "true"},
    "auth": {"token": "client-token", "password": "pw", "deviceToken": "dt"},
    "identity": {"deviceId": "dev", "publicKeyBase64Url": "pub", "privateKeyBase64Url": "priv"},
    "deviceInfo": {"platform": "ios", "platformVersion": "18"},
    "connectAuthFields": ["token"],
    "hasSharedAuth": "yes",
}


def test_parse_coerces_the_wire_values() -> None:
    cp = ConnectParams.parse(CLIENT)
    assert cp.runtime_id == "rt" and cp.port == 18789 and cp.tls is True
    assert cp.client.client_id == "app" and cp.client.platform_label == "ios 18"
    assert cp.creds.token == "client-token" and cp.identity.device_id == "dev"
    assert cp.auth_fields == ("token",) and cp.has_shared_auth is True
    assert ConnectParams.parse({}).client.client_id == "gateway-client"


@pytest.mark.parametrize("key", ["endpoint", "auth", "identity", "deviceInfo", "packageInfo"])
def test_wrong_types_are_invalid_params(key: str) -> None:
    with pytest.raises(RpcError) as err:
        ConnectParams.parse({"runtimeId": "r", key: ["not", "an", "object"]})
    assert err.value.code == INVALID_PARAMS and key in err.value.message


#: the client's example host is off loopback: it must be allowed by config (issue 16 item 10)
GW_ALLOWED = BridgeConfig(gateway=GatewayConfig(allowed_hosts=("gw.example",)))


def test_local_mode_uses_client_endpoint_and_auth() -> None:
    cfg = build_connect_config(ConnectParams.parse(CLIENT), GW_ALLOWED, "inbound")
    assert cfg.url == "wss://gw.example:18789"
    assert cfg.creds.token == "client-token" and cfg.creds.password == "pw"
    ipv6 = {**CLIENT, "endpoint": {"host": "::1", "port": 1}}
    assert build_connect_config(ConnectParams.parse(ipv6), BridgeConfig(), "").url == "ws://[::1]:1"
    with pytest.raises(GatewayError):
        build_connect_config(ConnectParams.parse({"runtimeId": "r"}), BridgeConfig(), "")


def test_by_default_only_loopback_and_configured_endpoints_are_dialed() -> None:
    config = BridgeConfig(openclaw_url="wss://gw.corp.example:8443/gw")

    def local(host: str, port: int) -> dict[str, object]:
        return {**CLIENT, "endpoint": {"host": host, "port": port}}

    for host, port in (
        ("127.0.0.1", 22),
        ("localhost", 18789),
        ("::1", 5),
        ("gw.corp.example", 8443),
    ):
        build_connect_config(ConnectParams.parse(local(host, port)), config, "")
    for host, port in (
        ("gw.corp.example", 22),
        ("10.0.0.1", 80),
        ("0.0.0.0", 80),
        ("gw.example", 1),
    ):
        with pytest.raises(GatewayError) as err:
            build_connect_config(ConnectParams.parse(local(host, port)), config, "")
        assert err.value.code == "HOST_NOT_ALLOWED"
    anything = BridgeConfig(gateway=GatewayConfig(allowed_hosts=("*",)))
    build_connect_config(ConnectParams.parse(local("10.0.0.1", 80)), anything, "")


def test_allowed_hosts_pin_local_endpoints() -> None:
    config = BridgeConfig(gateway=GatewayConfig(allowed_hosts=("127.0.0.1", "gw.example:443")))
    ok = {**CLIENT, "endpoint": {"host": "127.0.0.1", "port": 1}}
    assert build_connect_config(ConnectParams.parse(ok), config, "").url == "ws://127.0.0.1:1"
    for endpoint in ({"host": "evil.example", "port": 1}, {"host": "gw.example", "port": 80}):
        with pytest.raises(GatewayError) as err:
            build_connect_config(ConnectParams.parse({**CLIENT, "endpoint": endpoint}), config, "")
        assert err.value.code == "HOST_NOT_ALLOWED"
    assert (
        build_connect_config(
            ConnectParams.parse({**CLIENT, "endpoint": {"host": "gw.example", "port": 443}}),
            config,
            "",
        ).remote_address
        == "gw.example:443"
    )


@pytest.mark.parametrize(
    ("host", "port"),
    [
        ("127.0.0.1", 65536),  # websockets raised ValueError (an internal error)
        ("x]y", 80),  # an unbalanced bracket: ValueError too
        ("a:b@c", 80),
        ("gw.example/path", 80),  # the URL would read "/path:80" as the path
        ("gw.example?q", 80),
    ],
)
def test_an_endpoint_the_url_cannot_carry_is_invalid_before_any_dial(host: str, port: int) -> None:
    anything = BridgeConfig(gateway=GatewayConfig(allowed_hosts=("*",)))
    with pytest.raises(GatewayError) as err:
        build_connect_config(
            ConnectParams.parse({**CLIENT, "endpoint": {"host": host, "port": port}}), anything, ""
        )
    assert err.value.code == "INVALID_ENDPOINT"
    ok = {**CLIENT, "endpoint": {"host": "[::1]", "port": 65535}}
    assert build_connect_config(ConnectParams.parse(ok), anything, "").url == "ws://[::1]:65535"


def test_client_bearer_is_forwarded_only_when_configured() -> None:
    no_token = {**CLIENT, "auth": {}}
    cp = ConnectParams.parse(no_token)
    assert build_connect_config(cp, GW_ALLOWED, "inbound").creds.token == ""
    on = BridgeConfig(
        gateway=GatewayConfig(forward_client_bearer=True, allowed_hosts=("gw.example",))
    )
    assert build_connect_config(cp, on, "inbound").creds.token == "inbound"


@pytest.mark.parametrize(
    ("config", "token"),
    [
        (BridgeConfig(internal_service_token="Bearer svc"), "svc"),
        (BridgeConfig(bridge_auth_token="bridge"), "bridge"),
        (BridgeConfig(internal_service_token="svc", openclaw_token="oc"), "oc"),
        (BridgeConfig(), ""),
    ],
)
def test_openclaw_override(config: BridgeConfig, token: str) -> None:
    config = dataclasses.replace(config, openclaw_url="ws://127.0.0.1:18789/gw")
    cp = ConnectParams.parse({**CLIENT, "gatewayProviderId": "OpenClaw"})
    cfg = build_connect_config(cp, config, "inbound")
    assert cfg.url == "ws://127.0.0.1:18789/gw"
    assert cfg.remote_address == "127.0.0.1:18789"
    assert cfg.mode == "openclaw"  # normalized, so request-by-mode finds it
    assert cfg.creds.token == token and cfg.creds.password == ""
    assert cfg.creds.device_token == "dt"
    assert cfg.auth_sources == ("bridge",) and cfg.has_shared_auth is bool(token)


def test_openclaw_mode_without_an_openclaw_url_is_invalid_before_any_dial() -> None:
    config = BridgeConfig(openclaw_url="")
    cp = ConnectParams.parse({"runtimeId": "rt", "gatewayProviderId": "openclaw"})
    with pytest.raises(GatewayError) as err:
        build_connect_config(cp, config, "")
    assert err.value.code == "INVALID_ENDPOINT"  # it dialed ":80" and retried for ever
