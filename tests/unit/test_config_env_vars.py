"""Helper commands' environment (config/env_vars.py ``without_secrets``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from xwm_bridge.config import load_config, without_secrets


def test_the_bridge_s_secret_variables_stay_out() -> None:
    environ = {"ACP_AUTH_TOKEN": "tok-1", "COPY": "tok-1", "PATH": "/bin", "LIST": "a,tok-1"}
    assert without_secrets(environ) == {"PATH": "/bin"}


def test_a_credential_the_config_pulls_from_another_variable_stays_out(tmp_path: Path) -> None:
    """``auth_api_key: ${GEMINI_API_KEY}`` (README): the key's variable is not one of the
    bridge's own, but its value is a credential of the loaded config."""
    path = tmp_path / "bridge.yaml"
    provider = {"id": "gemini", "kind": "stdio", "command": ["gemini", "--acp"]}
    path.write_text(
        yaml.safe_dump({"providers": [{**provider, "auth_api_key": "${GEMINI_API_KEY}"}]})
    )
    environ = {"GEMINI_API_KEY": "AIza-very-secret-key", "HOME": "/home/x", "PATH": "/bin"}
    load_config(config_file=str(path), env=environ)
    assert without_secrets(environ) == {"HOME": "/home/x", "PATH": "/bin"}
