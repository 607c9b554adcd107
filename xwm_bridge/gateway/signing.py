"""Connect params and the Ed25519 device signature (gateway.md §4), sans-I/O."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from xwm_bridge.gateway.errors import GatewayError

MIN_PROTOCOL = 3
MAX_PROTOCOL = 4
ROLE = "operator"
CLIENT_MODE = "ui"
#: without a device identity the bridge is a backend client of the gateway: on
#: loopback with the shared token OpenClaw keeps its scopes without pairing.
BACKEND_MODE = "backend"
DEFAULT_CLIENT_ID = "gateway-client"
SCOPES = (
    "operator.admin",
    "operator.read",
    "operator.write",
    "operator.approvals",
    "operator.pairing",
)


# --- connect params and signature (§4) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    device_id: str = ""
    public_key: str = ""
    #: never in a repr (logs, tracebacks)
    private_key: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class ClientInfo:
    client_id: str = DEFAULT_CLIENT_ID
    app_name: str = ""
    version: str = ""
    platform: str = ""
    platform_version: str = ""
    device_family: str = ""
    model_identifier: str = ""
    locale: str = ""
    user_agent: str = ""

    @property
    def platform_label(self) -> str:
        if not self.platform_version:
            return self.platform
        return f"{self.platform} {self.platform_version}"


@dataclass(frozen=True, slots=True)
class Credentials:
    #: none of them in a repr (logs, tracebacks)
    token: str = field(default="", repr=False)
    device_token: str = field(default="", repr=False)
    password: str = field(default="", repr=False)

    def wire(self) -> dict[str, str] | None:
        out = {
            k: v
            for k, v in (
                ("token", self.token),
                ("deviceToken", self.device_token),
                ("password", self.password),
            )
            if v
        }
        return out or None


def decode_private_key(text: str) -> Ed25519PrivateKey:
    """base64url or standard alphabet, padding optional; 64 bytes = key, 32 = seed."""
    cleaned = text.strip().replace("-", "+").replace("_", "/")
    cleaned += "=" * (-len(cleaned) % 4)
    try:
        raw = base64.b64decode(cleaned, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GatewayError(str(exc), "DEVICE_IDENTITY_SIGN_FAILED") from None
    if len(raw) == 64:
        raw = raw[:32]
    elif len(raw) != 32:
        raise GatewayError(
            f"unsupported Ed25519 private key length: {len(raw)}", "DEVICE_IDENTITY_SIGN_FAILED"
        )
    return Ed25519PrivateKey.from_private_bytes(raw)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_payload(
    identity: Identity, client: ClientInfo, creds: Credentials, signed_at_ms: int, nonce: str
) -> str:
    token = creds.token.strip() or creds.device_token.strip()
    return "|".join(
        [
            "v3",
            identity.device_id,
            client.client_id,
            CLIENT_MODE,
            ROLE,
            ",".join(SCOPES),
            str(signed_at_ms),
            token,
            nonce,
            client.platform_label.strip().lower(),
            client.device_family.strip().lower(),
        ]
    )


def connect_params(
    client: ClientInfo,
    identity: Identity,
    creds: Credentials,
    *,
    nonce: str,
    signed_at_ms: int,
) -> dict[str, Any]:
    """The ``connect`` request params (§4.1), advertising protocols 3..4."""
    signed = bool(identity.device_id and identity.private_key)
    client_obj: dict[str, Any] = {
        "id": client.client_id,
        "displayName": f"{client.app_name.strip()} {client.device_family.strip()}",
        "version": client.version or "0",
        "platform": client.platform_label or "unknown",
        "mode": CLIENT_MODE if signed else BACKEND_MODE,
    }
    if client.device_family:
        client_obj["deviceFamily"] = client.device_family
    if client.model_identifier:
        client_obj["modelIdentifier"] = client.model_identifier
    if identity.device_id:
        client_obj["instanceId"] = f"{client.client_id}-{identity.device_id[:8]}"
    params: dict[str, Any] = {
        "minProtocol": MIN_PROTOCOL,
        "maxProtocol": MAX_PROTOCOL,
        "client": client_obj,
        "caps": ["tool-events"],
        "commands": [],
        "permissions": {},
        "role": ROLE,
        "scopes": list(SCOPES),
    }
    if client.locale:
        params["locale"] = client.locale
    if client.user_agent:
        params["userAgent"] = client.user_agent
    if signed:
        key = decode_private_key(identity.private_key)
        message = signed_payload(identity, client, creds, signed_at_ms, nonce)
        params["device"] = {
            "id": identity.device_id,
            "publicKey": identity.public_key,
            "signature": b64url(key.sign(message.encode())),
            "signedAt": signed_at_ms,
            "nonce": nonce,
        }
    auth = creds.wire()
    if auth is not None:
        params["auth"] = auth
    return params
