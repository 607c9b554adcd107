"""Session persistence: records and notification ledgers that survive restarts."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from xwm_bridge.config import BridgeConfig
from xwm_bridge.store.base import SessionStore, StoreLimits
from xwm_bridge.store.memory import MemoryStore
from xwm_bridge.store.sqlite import SQLiteStore

DB_NAME = "sessions.db"


def state_dir(config: BridgeConfig, env: dict[str, str] | None = None) -> Path:
    """``store.state_dir``, else ``$XDG_STATE_HOME/xwm-bridge``, else the XDG default
    ``$HOME/.local/state/xwm-bridge``, else ``./state`` (no usable home).

    Not the working directory first: ``acp-stdio`` is started by desktop apps from
    any directory, often a project checkout that must not collect a database.
    """
    env = dict(os.environ) if env is None else env
    if config.store.state_dir:
        return Path(config.store.state_dir)
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "xwm-bridge"
    home = env.get("HOME", "").strip()
    if home and os.path.isabs(home) and os.path.isdir(home):
        return Path(home) / ".local" / "state" / "xwm-bridge"
    return Path("state")


def with_own_state_dir(
    config: BridgeConfig, name: str, env: dict[str, str] | None = None
) -> BridgeConfig:
    """``config`` whose default SQLite state dir is the subdirectory ``name``: a process
    mode that may run beside ``serve`` (``xwm-bridge acp``, spawned by editors) never
    shares its database (one SQLite state dir belongs to one process). A configured
    ``store.state_dir`` is kept as it is."""
    if config.store.state_dir or config.store.backend != "sqlite":
        return config
    store = dataclasses.replace(config.store, state_dir=str(state_dir(config, env) / name))
    return dataclasses.replace(config, store=store)


def open_store(config: BridgeConfig) -> SessionStore:
    sc = config.store
    limits = StoreLimits(
        sc.ledger_max_entries,
        sc.ledger_max_age,
        sc.retention,
        ledger_max_bytes=sc.ledger_max_bytes,
        memory_max_bytes=sc.memory_max_bytes,
    )
    if sc.backend == "memory":
        return MemoryStore(limits)
    if sc.backend == "redis":
        from xwm_bridge.store.redis import RedisStore

        return RedisStore(
            sc.redis_url,
            limits,
            prefix=sc.redis_prefix,
            lease_ttl=sc.lease_ttl,
            timeout=sc.redis_timeout,
        )
    return SQLiteStore(state_dir(config) / DB_NAME, limits)


__all__ = [
    "MemoryStore",
    "SQLiteStore",
    "SessionStore",
    "StoreLimits",
    "open_store",
    "state_dir",
    "with_own_state_dir",
]
