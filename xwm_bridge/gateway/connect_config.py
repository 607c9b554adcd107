"""What a runtime's (re)connects dial with, and the offline snapshot it implies
(gateway.md §2, §7.2)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class ConnectConfig:
    """Everything a (re)connect needs, fixed at ``xworkmate.gateway.connect``."""

    #: not in a repr: a URL may carry credentials (``remote_address`` says where)
    url: str = dataclasses.field(repr=False)
    remote_address: str
    mode: str
    client: p.ClientInfo
    identity: p.Identity
    creds: p.Credentials
    auth_mode: str = ""
    auth_fields: tuple[str, ...] = ()
    auth_sources: tuple[str, ...] = ()
    has_shared_auth: bool = False
    has_device_token: bool = False

    def with_device_token(self, token: str) -> ConnectConfig:
        """The same config with the device token a ``hello-ok`` returned (§3.4)."""
        creds = p.Credentials(self.creds.token, token, self.creds.password)
        return dataclasses.replace(self, creds=creds, has_device_token=True)


def offline_snapshot(cfg: ConnectConfig | None, old: Snapshot) -> Snapshot:
    """The ``offline`` snapshot of §7.2: it keeps the mode, device, role, scopes and
    the connect-auth fields."""
    snap = Snapshot(
        mode=cfg.mode if cfg else old.mode,
        device_id=cfg.identity.device_id if cfg else old.device_id,
        auth_role=old.auth_role,
        auth_scopes=list(old.auth_scopes),
    )
    if cfg is not None:
        snap.connect_auth_mode = cfg.auth_mode
        snap.connect_auth_fields = list(cfg.auth_fields)
        snap.connect_auth_sources = list(cfg.auth_sources)
        snap.has_shared_auth = cfg.has_shared_auth
        snap.has_device_token = cfg.has_device_token or bool(cfg.creds.device_token)
    return snap
