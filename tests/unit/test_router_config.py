"""The `router` and `mounts` config sections (issue 3): defaults, env names,
YAML merge, validation, secret redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from xwm_bridge.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config(env={}).config
    assert cfg.router.llm_base_url == "https://api.openai.com/v1"
    assert cfg.router.classifier_timeout == 10.0
    assert cfg.router.skill_commands_enabled is False
    assert cfg.router.memory_project_roots is None
    assert cfg.memory_roots == cfg.allowed_roots == ()
    assert cfg.mounts.cli_discovery_enabled is False


def test_env_names_from_the_spec() -> None:
    env = {
        "LLM_API_KEY": " sk-server-secret ",
        "LLM_BASE_URL": "https://llm.internal/v1",
        "ACP_FIND_SKILLS_BIN": "/bin/find",
        "ACP_INSTALL_SKILL_BIN": "install-skill",
        "ACP_ROUTING_MODEL": "route-m",
    }
    loaded = load_config(env=env)
    r = loaded.config.router
    assert (r.llm_api_key, r.llm_base_url) == ("sk-server-secret", "https://llm.internal/v1")
    assert (r.find_skills_bin, r.install_skill_bin) == ("/bin/find", "install-skill")
    assert loaded.config.routing_model == "route-m"
    assert loaded.sources["router.llm_api_key"] == "env:LLM_API_KEY"
    assert "sk-server-secret" in loaded.config.secrets()


def test_env_merges_into_yaml_section(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("router:\n  classifier_timeout: 3\n  memory_project_roots: [/srv]\n")
    cfg = load_config(config_file=str(path), env={"LLM_API_KEY": "k-1234"}).config
    assert cfg.router.classifier_timeout == 3.0
    assert cfg.router.memory_project_roots == ("/srv",)
    assert cfg.router.llm_api_key == "k-1234"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("router:\n  memory_project_roots: [relative]\n", "router.memory_project_roots[0]"),
        ("router:\n  classifier_timeout: 0\n", "router: timeouts"),
        ("router:\n  classifier_max_concurrency: 0\n", "router.classifier_max_concurrency"),
        ("router:\n  memory_max_bytes: 0\n", "router.memory_max_bytes: must be greater"),
        ("router:\n  skill_command_max_output: 0\n", "router.skill_command_max_output: must"),
        ("router:\n  nope: 1\n", "router.nope: unknown key"),
        ("mounts:\n  cli_timeout: x\n", "mounts.cli_timeout"),
    ],
)
def test_bad_values(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(config_file=str(path), env={})


def test_project_memory_roots_default_to_allowed_roots(tmp_path: Path) -> None:
    """Issue 15 item 4: unset → allowed_roots; an explicit empty list → nowhere."""
    path = tmp_path / "c.yaml"
    path.write_text("allowed_roots: [/srv/work]\n")
    cfg = load_config(config_file=str(path), env={}).config
    assert cfg.memory_roots == ("/srv/work",)
    path.write_text("allowed_roots: [/srv/work]\nrouter:\n  memory_project_roots: []\n")
    assert load_config(config_file=str(path), env={}).config.memory_roots == ()
    path.write_text("allowed_roots: [/srv/work]\nrouter:\n  memory_project_roots: [/p]\n")
    assert load_config(config_file=str(path), env={}).config.memory_roots == ("/p",)
