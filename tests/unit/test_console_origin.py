"""``/console/ws``'s own-origin rule and ``console.allowed_origins``."""

from __future__ import annotations

from pathlib import Path

import pytest

from xwm_bridge.config import ConfigError, load_config
from xwm_bridge.transport.console import same_origin


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://127.0.0.1:8787", "127.0.0.1:8787", True),
        ("http://LOCALHOST:8787", "localhost:8787", True),
        ("https://bridge.example", "bridge.example", True),
        ("https://bridge.example", "bridge.example:443", True),
        ("http://bridge.example:80", "bridge.example", True),
        ("http://[::1]:8787", "[::1]:8787", True),
        ("http://bridge.example/", "bridge.example", True),
        # another port, host or scheme's default port
        ("http://127.0.0.1:8788", "127.0.0.1:8787", False),
        ("http://localhost:8787", "127.0.0.1:8787", False),
        ("https://bridge.example", "bridge.example:80", False),
        ("http://bridge.example", "bridge.example:443", False),
        # not a page's origin
        ("null", "127.0.0.1:8787", False),
        ("file://", "127.0.0.1:8787", False),
        ("ws://127.0.0.1:8787", "127.0.0.1:8787", False),
        ("chrome-extension://abc", "abc", False),
        ("http://127.0.0.1:8787/path", "127.0.0.1:8787", False),
        ("http://u@127.0.0.1:8787", "127.0.0.1:8787", False),
        ("http://127.0.0.1:x", "127.0.0.1:x", False),
        ("http://127.0.0.1:8787", None, False),
        ("http://127.0.0.1:8787", "", False),
        ("http://127.0.0.1:8787", "127.0.0.1:8787/x", False),
        ("http://[::1", "[::1", False),
    ],
)
def test_same_origin(origin: str, host: str | None, same: bool) -> None:
    assert same_origin(origin, host) is same


def test_console_allowed_origins_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("console:\n  allowed_origins: [https://ops.example, 'http://localhost:*']\n")
    cfg = load_config(config_file=str(path), env={}).config
    assert cfg.console.allowed_origins == ("https://ops.example", "http://localhost:*")
    assert load_config(env={}).config.console.allowed_origins == ()
    for bad in ("ops.example", "ftp://ops.example", "https://ops.example/path", "null"):
        path.write_text(f"console:\n  allowed_origins: ['{bad}']\n")
        with pytest.raises(ConfigError, match=r"console\.allowed_origins\[0\]"):
            load_config(config_file=str(path), env={})
