"""Where the SQLite session store lives by default (issue 6)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xwm_bridge.config import BridgeConfig, StoreConfig
from xwm_bridge.store import state_dir, with_own_state_dir


def test_configured_dir_wins(tmp_path: Path) -> None:
    cfg = BridgeConfig(store=StoreConfig(state_dir=str(tmp_path / "s")))
    assert state_dir(cfg, {"XDG_STATE_HOME": "/x", "HOME": str(tmp_path)}) == tmp_path / "s"


def test_xdg_state_home_then_home_then_cwd(tmp_path: Path) -> None:
    cfg = BridgeConfig()
    assert state_dir(cfg, {"XDG_STATE_HOME": "/var/x", "HOME": str(tmp_path)}) == Path(
        "/var/x/xwm-bridge"
    )
    assert state_dir(cfg, {"XDG_STATE_HOME": "relative", "HOME": str(tmp_path)}) == (
        tmp_path / ".local" / "state" / "xwm-bridge"
    )
    assert state_dir(cfg, {"HOME": "/nonexistent"}) == Path("state")
    assert state_dir(dataclasses.replace(cfg), {}) == Path("state")


def test_redis_password_is_a_secret() -> None:
    cfg = BridgeConfig(store=StoreConfig(redis_url="redis://:s3cret-pw@redis:6379/0"))
    assert "s3cret-pw" in cfg.secrets()


def test_acp_mode_has_its_own_default_state_dir(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    own = with_own_state_dir(BridgeConfig(), "acp", env)
    assert state_dir(own, env) == tmp_path / ".local" / "state" / "xwm-bridge" / "acp"
    set_dir = BridgeConfig(store=StoreConfig(state_dir=str(tmp_path / "mine")))
    assert with_own_state_dir(set_dir, "acp", env) is set_dir
    redis = BridgeConfig(store=StoreConfig(backend="redis"))
    assert with_own_state_dir(redis, "acp", env) is redis
