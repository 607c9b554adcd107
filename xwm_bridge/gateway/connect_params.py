"""The client's ``xworkmate.gateway.connect`` params, typed at the boundary, and the
:class:`ConnectConfig` they resolve to (gateway.md §2, §9): the endpoint checked
before any dial (its URL, ``gateway.allowed_hosts``), the client's credentials (or
its bearer, when ``gateway.forward_client_bearer``), and the ``openclaw`` override
that takes both from the bridge config. Sans-I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig
from xwm_bridge.gateway.protocol import GatewayError
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.netaddr import HostPolicy

OPENCLAW = "openclaw"
LOCAL = "local"


def _obj(params: dict[str, Any], key: str) -> dict[str, Any]:
    value = params.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RpcError(INVALID_PARAMS, f"{key} must be an object")
    return value


@dataclass(frozen=True, slots=True)
class ConnectParams:
    runtime_id: str
    mode: str
    client: p.ClientInfo
    identity: p.Identity
    creds: p.Credentials
    host: str
    port: int
    tls: bool
    auth_mode: str
    auth_fields: tuple[str, ...]
    auth_sources: tuple[str, ...]
    has_shared_auth: bool
    has_device_token: bool

    @classmethod
    def parse(cls, params: dict[str, Any]) -> ConnectParams:
        endpoint = _obj(params, "endpoint")
        package = _obj(params, "packageInfo")
        device = _obj(params, "deviceInfo")
        identity = _obj(params, "identity")
        auth = _obj(params, "auth")
        return cls(
            runtime_id=coerce.text(params.get("runtimeId")),
            mode=coerce.text(params.get("gatewayProviderId"), LOCAL),
            client=p.ClientInfo(
                client_id=coerce.text(params.get("clientId"), p.DEFAULT_CLIENT_ID),
                app_name=coerce.text(package.get("appName")),
                version=coerce.text(package.get("version")),
                platform=coerce.text(device.get("platform")),
                platform_version=coerce.text(device.get("platformVersion")),
                device_family=coerce.text(device.get("deviceFamily")),
                model_identifier=coerce.text(device.get("modelIdentifier")),
                locale=coerce.text(params.get("locale")),
                user_agent=coerce.text(params.get("userAgent")),
            ),
            identity=p.Identity(
                device_id=coerce.text(identity.get("deviceId")),
                public_key=coerce.text(identity.get("publicKeyBase64Url")),
                private_key=coerce.text(identity.get("privateKeyBase64Url")),
            ),
            creds=p.Credentials(
                token=coerce.text(auth.get("token")),
                device_token=coerce.text(auth.get("deviceToken")),
                password=coerce.text(auth.get("password")),
            ),
            host=coerce.text(endpoint.get("host")),
            port=coerce.positive_int(endpoint.get("port")),
            tls=coerce.loose_bool(endpoint.get("tls")),
            auth_mode=coerce.text(params.get("connectAuthMode")),
            auth_fields=tuple(coerce.string_list(params.get("connectAuthFields")) or ()),
            auth_sources=tuple(coerce.string_list(params.get("connectAuthSources")) or ()),
            has_shared_auth=coerce.loose_bool(params.get("hasSharedAuth")),
            has_device_token=coerce.loose_bool(params.get("hasDeviceToken")),
        )


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _dial_url(host: str, port: int, tls: bool) -> str:
    """``ws(s)://host:port``, or INVALID_ENDPOINT before any dial: a port past 65535 or
    a host the URL would read differently (``/``, ``?``, ``@``, a stray ``]``)."""
    if port > 65535:
        raise GatewayError("endpoint.port must be between 1 and 65535", "INVALID_ENDPOINT")
    url = f"{'wss' if tls else 'ws'}://{_host_port(host, port)}"
    try:
        parts = urlsplit(url)
        same = parts.port == port and parts.hostname == host.strip("[]").lower()
        ok = same and not (parts.path or parts.query or parts.fragment or parts.username)
    except ValueError:
        ok = False
    if not ok:
        raise GatewayError(
            f"endpoint.host is not a host name or address: {host}", "INVALID_ENDPOINT"
        )
    return url


def openclaw_token(config: BridgeConfig) -> str:
    """The bare credential for the ``openclaw`` gateway (never ``Bearer …``: weakness 5)."""
    token = config.openclaw_token or config.internal_service_token or config.bridge_auth_token
    if token.lower().startswith("bearer "):
        token = token[7:].strip()
    return token


def build_connect_config(
    cp: ConnectParams, config: BridgeConfig, client_bearer: str
) -> ConnectConfig:
    """Resolve endpoint and credentials; ``openclaw`` mode takes both from bridge config."""
    if cp.mode.lower() == OPENCLAW:
        url = config.openclaw_url.strip()
        if not url:  # config validation lets only an empty one through
            raise GatewayError(
                "no OpenClaw gateway is configured (openclaw_url)", "INVALID_ENDPOINT"
            )
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        token = openclaw_token(config)
        return ConnectConfig(
            url=url,
            remote_address=_host_port(parts.hostname or "", port),
            mode=OPENCLAW,  # normalized: request-by-mode finds it whatever the client's case
            client=cp.client,
            identity=cp.identity,
            creds=p.Credentials(token=token, device_token=cp.creds.device_token),
            auth_mode="shared-token",
            auth_fields=("token",),
            auth_sources=("bridge",),
            has_shared_auth=bool(token),
            has_device_token=cp.has_device_token,
        )
    if not cp.host or not cp.port:
        raise GatewayError("endpoint.host and endpoint.port are required", "INVALID_ENDPOINT")
    url = _dial_url(cp.host, cp.port, cp.tls)
    policy = HostPolicy(config.gateway.allowed_hosts, config.configured_endpoints())
    if not policy.allows(cp.host, cp.port):
        raise GatewayError(f"gateway host not allowed: {cp.host}", "HOST_NOT_ALLOWED")
    creds = cp.creds
    if not creds.token and config.gateway.forward_client_bearer and client_bearer:
        creds = p.Credentials(client_bearer, creds.device_token, creds.password)
    address = _host_port(cp.host, cp.port)
    return ConnectConfig(
        url=url,
        remote_address=address,
        mode=cp.mode,
        client=cp.client,
        identity=cp.identity,
        creds=creds,
        auth_mode=cp.auth_mode,
        auth_fields=cp.auth_fields,
        auth_sources=cp.auth_sources,
        has_shared_auth=cp.has_shared_auth,
        has_device_token=cp.has_device_token,
    )
