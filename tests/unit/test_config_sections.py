"""The ``multi_agent`` and ``toolbridge`` config sections: env names, validation, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from xwm_bridge.config import ConfigError, load_config


def test_toolbridge_env_names_from_spec() -> None:
    env = {
        "LLM_API_KEY": " sk-llm ",
        "LLM_BASE_URL": "http://llm",
        "LLM_MODEL": "m",
        "CLAUDE_BIN": "/opt/claude",
        "CLAUDE_REVIEW_MODEL": "opus",
        "CLAUDE_REVIEW_SYSTEM": "sys",
        "CLAUDE_REVIEW_TOOLS": "Read",
        "CLAUDE_REVIEW_TIMEOUT_SEC": "30",
        "VAULT_SERVER_URL": "http://vault",
        "VAULT_SERVER_ROOT_ACCESS_TOKEN": "hvs.secret-token",
        "VAULT_NAMESPACE": "ns",
        "XWM_MULTI_AGENT_MAX_ITERATIONS": "5",
        "XWM_MULTI_AGENT_API_KEY": "sk-multi",
    }
    loaded = load_config(env=env)
    tb, ma = loaded.config.toolbridge, loaded.config.multi_agent
    assert (tb.llm_api_key, tb.llm_base_url, tb.llm_model) == ("sk-llm", "http://llm", "m")
    assert (tb.claude_bin, tb.claude_review_model) == ("/opt/claude", "opus")
    assert (tb.claude_review_system, tb.claude_review_tools) == ("sys", "Read")
    assert tb.claude_review_timeout == 30
    assert (tb.vault_url, tb.vault_token, tb.vault_namespace) == (
        "http://vault",
        "hvs.secret-token",
        "ns",
    )
    assert ma.max_iterations == 5 and ma.api_key == "sk-multi"
    assert loaded.sources["toolbridge.vault_token"] == "env:VAULT_SERVER_ROOT_ACCESS_TOKEN"
    secrets = loaded.config.secrets()
    assert {"sk-llm", "hvs.secret-token", "sk-multi"} <= set(secrets)


def test_defaults() -> None:
    cfg = load_config(env={}).config
    assert cfg.multi_agent.max_iterations == 3
    assert cfg.multi_agent.workers == 1
    assert cfg.multi_agent.call_timeout == 120
    assert cfg.toolbridge.llm_base_url == "https://api.openai.com/v1"
    assert cfg.toolbridge.claude_review_timeout == 600
    assert cfg.toolbridge.vault_timeout == 30


def test_env_overrides_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("toolbridge:\n  llm_model: from-file\n  chat_timeout: 5\n")
    cfg = load_config(config_file=str(path), env={"LLM_MODEL": "from-env"}).config
    assert cfg.toolbridge.llm_model == "from-env"
    assert cfg.toolbridge.chat_timeout == 5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"XWM_MULTI_AGENT_MAX_ITERATIONS": "0"}, "multi_agent.max_iterations: must be between"),
        ({"CLAUDE_REVIEW_TIMEOUT_SEC": "soon"}, "toolbridge.claude_review_timeout: expected a"),
        ({"CLAUDE_REVIEW_TIMEOUT_SEC": "0"}, "toolbridge.claude_review_timeout: must be greater"),
    ],
)
def test_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(env=env)
    assert str(err.value).startswith(message)
