"""The agent registry, detection, the agent's clean environment and the bwrap argv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xwm_bridge.config import (
    DEFAULT_PROVIDERS,
    AgentsConfig,
    BridgeConfig,
    ProviderConfig,
    load_config,
)
from xwm_bridge.providers.stdio import launch, registry
from xwm_bridge.providers.stdio.agent import AgentError


def exe(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_registry_entries_are_complete() -> None:
    ids = [e.id for e in registry.REGISTRY]
    assert ids == ["opencode", "gemini", "codex", "claude", "qwen", "goose"]
    for e in registry.REGISTRY:
        assert e.executable and e.label and e.source and e.state, e.id
    assert registry.entry("gemini") is not None and registry.entry("gemini").args == ("--acp",)
    assert registry.entry("opencode").args == ("acp",)  # type: ignore[union-attr]
    assert registry.entry("codex").executable == "codex-acp"  # type: ignore[union-attr]
    assert registry.entry("claude").executable == "claude-agent-acp"  # type: ignore[union-attr]
    by_exe = ProviderConfig("my-gem", kind="stdio", command=("/opt/bin/gemini", "--acp"))
    assert registry.entry_for(by_exe) is registry.entry("gemini")


def test_detect_without_config_puts_local_agents_first(tmp_path: Path) -> None:
    found = exe(tmp_path / "bin", "opencode")
    exe(tmp_path / "path", "goose")
    env = {"PATH": str(tmp_path / "path")}
    config = BridgeConfig(agents=AgentsConfig(search_paths=(str(found.parent),)))
    result = registry.detect(config, env)
    ids = [p.id for p in result.config.providers]
    assert ids == ["opencode", "goose", "codex", "gemini"]  # opencode's remote default replaced
    opencode = result.config.providers[0]
    assert opencode.is_stdio and opencode.command == (str(found), "acp")
    assert result.found == ["opencode", "goose"]
    assert result.missing["gemini"] == (
        "gemini not found in agents.search_paths or PATH "
        "(install: npm install -g @google/gemini-cli)"
    )
    gemini_default = next(p for p in DEFAULT_PROVIDERS if p.id == "gemini")
    assert gemini_default in result.config.providers  # not found: the remote one stays


def test_detect_with_configured_providers_appends_and_config_wins(tmp_path: Path) -> None:
    exe(tmp_path, "opencode")
    exe(tmp_path, "gemini")
    path = tmp_path / "c.yaml"
    path.write_text(
        "providers:\n"
        "  - {id: mine, endpoint: 'http://127.0.0.1:1/acp/rpc'}\n"
        "  - {id: gemini, kind: stdio, command: [gemini, --acp, --yolo]}\n"
        "agents: {detect_skip: [opencode]}\n"
    )
    config = load_config(config_file=str(path), env={}).config
    result = registry.detect(config, {"PATH": str(tmp_path)})
    assert [p.id for p in result.config.providers] == ["mine", "gemini"]
    statuses = {a.id: a for a in result.agents}
    assert statuses["gemini"].source == "config" and statuses["gemini"].found
    assert statuses["opencode"].reason == "skipped (agents.detect_skip)"
    off = registry.detect(
        load_config(env={"XWM_AGENTS_DETECT": "false"}).config, {"PATH": str(tmp_path)}
    )
    assert [p.id for p in off.config.providers] == ["codex", "opencode", "gemini"]
    assert off.found == []


def test_clean_environment() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LANG": "C",
        "TMPDIR": "/t",
        "ACP_AUTH_TOKEN": "bridge-token-1",
        "LLM_API_KEY": "llm-key-1",
        "GEMINI_API_KEY": "gk",
        "GOOGLE_CLOUD_PROJECT": "p",
        "OPENAI_API_KEY": "llm-key-1",  # the same value as a bridge secret
        "OTHER": "x",
    }
    built = launch.agent_environment(
        environ, ("GEMINI_*", "GOOGLE_*", "OPENAI_API_KEY"), ("EXTRA=1",), ("llm-key-1",)
    )
    assert built.env == {
        "PATH": "/bin",
        "HOME": "/home/u",
        "LANG": "C",
        "TMPDIR": "/t",
        "GEMINI_API_KEY": "gk",
        "GOOGLE_CLOUD_PROJECT": "p",
        "EXTRA": "1",
    }
    assert built.withheld == ("OPENAI_API_KEY",)


def test_a_list_of_bridge_tokens_is_withheld_too() -> None:
    """``XWM_CLIENT_TOKENS`` / ``XWM_ADMIN_TOKENS`` hold several tokens, comma-separated:
    the variable is withheld when any of its items is a bridge secret."""
    environ = {
        "XWM_ADMIN_TOKENS": "adm-1111,adm-2222",
        "XWM_CLIENT_TOKENS": "cli-1111, cli-2222",
        "XWM_OTHER": "a,b",
    }
    secrets = ("adm-1111", "adm-2222", "cli-1111", "cli-2222")
    built = launch.agent_environment(environ, ("XWM_*",), (), secrets)
    assert built.env == {"XWM_OTHER": "a,b"}
    assert built.withheld == ("XWM_ADMIN_TOKENS", "XWM_CLIENT_TOKENS")


def test_a_bridge_secret_variable_is_never_copied_by_a_pattern() -> None:
    """``GEMINI_*`` (the gemini entry) must not copy ``GEMINI_ADAPTER_AUTH_TOKEN``, which a
    ``serve`` daemon's config does not hold; its value is withheld under any name too."""
    environ = {
        "GEMINI_ADAPTER_AUTH_TOKEN": "adapter-tok-1",
        "GEMINI_MODEL": "m",
        "GOOGLE_API_KEY": "adapter-tok-1",
    }
    built = launch.agent_environment(environ, ("GEMINI_*", "GOOGLE_*"), ("GEMINI_X=1",))
    assert built.env == {"GEMINI_MODEL": "m", "GEMINI_X": "1"}
    assert built.withheld == ("GEMINI_ADAPTER_AUTH_TOKEN", "GOOGLE_API_KEY")


def test_agent_spec_uses_registry_env_and_provider_settings(tmp_path: Path) -> None:
    provider = ProviderConfig(
        "gemini", kind="stdio", command=("gemini", "--acp"), env=("A=1",), pass_env=("MINE",)
    )
    config = BridgeConfig(auth_token="tok-12345", providers=(provider,))
    environ = {"PATH": "/bin", "GEMINI_X": "1", "MINE": "2", "ACP_AUTH_TOKEN": "tok-12345"}
    spec = launch.agent_spec(provider, config, environ=environ)
    assert spec.env == {"PATH": "/bin", "GEMINI_X": "1", "MINE": "2", "A": "1"}
    assert spec.argv == ("gemini", "--acp")


def test_bwrap_argv_and_state_dirs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    argv = launch.bwrap_argv(
        "bwrap", ["agent", "acp"], str(work), [str(tmp_path / "missing"), str(work)]
    )
    assert argv[:4] == ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
    assert "--ro-bind" in argv and argv[argv.index("--tmpfs") + 1] == "/tmp"
    assert argv.count("--bind") == 1 and argv[argv.index("--bind") + 1] == str(work)
    assert argv[-3:] == ["--", "agent", "acp"]
    assert argv[argv.index("--chdir") + 1] == str(work)
    entry = registry.entry("opencode")
    paths = registry.state_paths(entry, {"HOME": "/h", "XDG_DATA_HOME": "/d"})
    assert paths == [
        "/d/opencode",
        "/h/.config/opencode",
        "/h/.cache/opencode",
        "/h/.local/state/opencode",
    ]
    assert registry.state_paths(registry.entry("claude"), {"HOME": "/h"}) == [
        "/h/.claude",
        "/h/.claude.json",
    ]


def test_an_agent_program_under_tmp_stays_visible_in_the_sandbox(tmp_path: Path) -> None:
    # a checkout or venv under /tmp would vanish under the private /tmp
    tmp_root = Path("/tmp") / f"xwm-prog-{tmp_path.name}"
    (tmp_root / "venv" / "bin").mkdir(parents=True)
    (tmp_root / "lib").mkdir()
    exe = tmp_root / "venv" / "bin" / "agent"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    try:
        env = {"PATH": f"{tmp_root / 'venv' / 'bin'}:/usr/bin", "PYTHONPATH": str(tmp_root / "lib")}
        assert launch.program_paths(["agent", "acp"], env) == [str(tmp_root)]
        assert launch.program_paths(["/usr/bin/env", "x"], {"PATH": "/usr/bin"}) == []
        work = tmp_path / "work"
        work.mkdir()
        argv = launch.bwrap_argv("bwrap", [str(exe)], str(work), [], [str(tmp_root)])
        tmpfs, ro = argv.index("--tmpfs"), argv.index(str(tmp_root))
        rw = argv.index("--bind")
        assert tmpfs < ro < rw and argv[ro - 1] == "--ro-bind" and argv[ro + 1] == str(tmp_root)
    finally:
        exe.unlink()
        for d in (tmp_root / "venv" / "bin", tmp_root / "venv", tmp_root / "lib", tmp_root):
            d.rmdir()


def test_sandboxed_spec_wraps_and_creates_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    provider = ProviderConfig("gemini", kind="stdio", command=("gemini", "--acp"))
    agents = AgentsConfig(sandbox="bwrap", bwrap_path="/usr/bin/bwrap")
    config = BridgeConfig(providers=(provider,), agents=agents)
    spec = launch.agent_spec(provider, config, str(tmp_path), {"HOME": str(home), "PATH": "/b"})
    assert spec.argv[0] == "/usr/bin/bwrap" and spec.argv[-2:] == ("gemini", "--acp")
    assert os.path.isdir(home / ".gemini")  # created so it can be bound writable
    binds = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "--bind"]
    assert binds == [str(tmp_path), str(home / ".gemini")]
    assert spec.env["TMPDIR"] == "/tmp" and spec.cwd == str(tmp_path)


def test_mcp_env_only_for_providers_that_give_mcp_servers() -> None:
    plain = ProviderConfig("gemini", kind="stdio", command=("gemini", "--acp"))
    with_tools = ProviderConfig("gemini", kind="stdio", command=("gemini",), toolbridge=True)
    overridden = ProviderConfig(
        "gemini",
        kind="stdio",
        command=("gemini",),
        toolbridge=True,
        env=("GEMINI_CLI_TRUST_WORKSPACE=false",),
    )
    config = BridgeConfig()
    assert "GEMINI_CLI_TRUST_WORKSPACE" not in launch.agent_spec(plain, config, environ={}).env
    assert launch.agent_spec(with_tools, config, environ={}).env == {
        "GEMINI_CLI_TRUST_WORKSPACE": "true"
    }
    assert launch.agent_spec(overridden, config, environ={}).env == {
        "GEMINI_CLI_TRUST_WORKSPACE": "false"
    }


def test_sandbox_without_bwrap_is_a_clear_error() -> None:
    provider = ProviderConfig("x", kind="stdio", command=("x",))
    agents = AgentsConfig(sandbox="bwrap", bwrap_path="/nonexistent/bwrap")
    with pytest.raises(AgentError, match="/nonexistent/bwrap is not installed"):
        launch.agent_spec(provider, BridgeConfig(agents=agents), environ={})


def test_a_sandboxed_agent_is_not_started_in_a_directory_outside_allowed_roots(
    tmp_path: Path,
) -> None:
    """Under bwrap the agent's directory is bound writable: a client's ``/`` or home
    directory undid the sandbox's write confinement. With ``allowed_roots`` set it must
    lie under one (after symlinks), and what is bound is the resolved directory."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "work").mkdir(parents=True)
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "inner").symlink_to(root / "work")
    provider = ProviderConfig("gemini", kind="stdio", command=("gemini", "--acp"))
    agents = AgentsConfig(sandbox="bwrap", bwrap_path="/usr/bin/bwrap")
    config = BridgeConfig(providers=(provider,), agents=agents, allowed_roots=(str(root),))
    env = {"HOME": str(tmp_path), "PATH": "/b"}
    for cwd in ("/", str(outside), str(root / "link"), "relative/dir"):
        with pytest.raises(AgentError, match="outside allowed_roots"):
            launch.agent_spec(provider, config, cwd, env)
    spec = launch.agent_spec(provider, config, str(root / "inner"), env)
    binds = [spec.argv[i + 1] for i, a in enumerate(spec.argv) if a == "--bind"]
    assert binds[0] == str(root / "work") and spec.cwd == str(root / "work")
    unconfined = BridgeConfig(providers=(provider,), agents=agents)  # no roots: as given
    assert launch.agent_spec(provider, unconfined, str(outside), env).cwd == str(outside)
