"""The runtime snapshot clients see in ``xworkmate.gateway.snapshot`` (gateway.md §7.2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Snapshot:
    status: str = "offline"
    status_text: str = "Offline"
    mode: str = "local"
    server_name: str = ""
    remote_address: str = ""
    main_session_key: str = ""
    last_error: str = ""
    last_error_code: str = ""
    last_error_detail_code: str = ""
    last_connected_at_ms: int = 0
    device_id: str = ""
    auth_role: str = ""
    auth_scopes: list[str] = field(default_factory=list)
    connect_auth_mode: str = ""
    connect_auth_fields: list[str] = field(default_factory=list)
    connect_auth_sources: list[str] = field(default_factory=list)
    has_shared_auth: bool = False
    has_device_token: bool = False
    protocol: int = 0
    health_payload: dict[str, Any] | None = None

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "mode": self.mode,
            "statusText": self.status_text,
            "authScopes": self.auth_scopes or None,
            "connectAuthFields": self.connect_auth_fields or None,
            "connectAuthSources": self.connect_auth_sources or None,
            "hasSharedAuth": self.has_shared_auth,
            "hasDeviceToken": self.has_device_token,
        }
        optional = {
            "serverName": self.server_name,
            "remoteAddress": self.remote_address,
            "mainSessionKey": self.main_session_key,
            "lastError": self.last_error,
            "lastErrorCode": self.last_error_code,
            "lastErrorDetailCode": self.last_error_detail_code,
            "lastConnectedAtMs": self.last_connected_at_ms,
            "deviceId": self.device_id,
            "authRole": self.auth_role,
            "connectAuthMode": self.connect_auth_mode,
            "protocol": self.protocol,
            "healthPayload": self.health_payload,
        }
        out.update({k: v for k, v in optional.items() if v})
        return out
