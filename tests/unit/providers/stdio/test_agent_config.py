"""Config of stdio providers and the agents section; fs confinement; adapter settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xwm_bridge.adapters.agent_adapter import AdapterSettings
from xwm_bridge.config import BridgeConfig, ConfigError, ProviderConfig, load_config
from xwm_bridge.providers.stdio import client_fs
from xwm_bridge.providers.stdio.agent import ClientError


def load(tmp_path: Path, text: str) -> BridgeConfig:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return load_config(config_file=str(path), env={}).config


def test_stdio_provider_and_agents_section(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
providers:
  - {id: oc, kind: stdio, command: [opencode, acp], env: ["OPENAI_API_KEY=sk-secret-1"]}
  - {id: off, kind: stdio}
agents:
  permission_timeout: 5
  terminal_enabled: true
  permission_rules: [{action: reject, kind: edit, path: "*.env"}]
""",
    )
    assert [p.id for p in cfg.available_providers] == ["oc"]
    oc = cfg.providers[0]
    assert oc.is_stdio and oc.command == ("opencode", "acp") and oc.fs_read is True
    assert cfg.agents.permission_timeout == 5 and cfg.agents.terminal_enabled
    assert cfg.agents.permission_rules[0].action == "reject"
    assert "sk-secret-1" in cfg.secrets()
    assert "sk-secret-1" not in cfg.own_secrets()  # the agent's key, not the bridge's
    assert BridgeConfig().agents.permission_timeout == 120
    assert BridgeConfig().agents.terminal_enabled is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("providers: [{id: a, kind: pipe, command: [x]}]", "providers[0].kind"),
        ("providers: [{id: a, kind: stdio, command: [x], env: [NOVALUE]}]", "providers[0].env[0]"),
        ("agents: {permission_rules: [{action: allow_always}]}", "agents.permission_rules[0]"),
        ("agents: {prompt_timeout: -1}", "agents.prompt_timeout"),
        ("agents: {permission_timeout: 0}", "agents.permission_timeout"),
        ("agents: {sandbox: docker}", "agents.sandbox: must be one of none, bwrap"),
        ("agents: {search_paths: [rel]}", "agents.search_paths[0]: must be an absolute path"),
        ("agents: {toolbridge_env: [NOVALUE]}", "agents.toolbridge_env[0]"),
        (
            "providers: [{id: a, kind: stdio, command: [x], pass_env: [LLM_API_KEY]}]",
            "providers[0].pass_env[0]: LLM_API_KEY would copy a bridge secret",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], pass_env: [ACP_*]}]",
            "providers[0].pass_env[0]: ACP_",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], pass_env: [XWM_ADMIN_TOKENS]}]",
            "providers[0].pass_env[0]: XWM_ADMIN_TOKENS would copy a bridge secret",
        ),
        ("providers: [{id: a, kind: stdio, command: [x], pass_env: [a-b]}]", "pass_env[0]"),
        ("providers: [{id: a, kind: stdio, command: [x], options: [x]}]", "options[0]"),
        (
            "providers: [{id: a, kind: stdio, command: [x], mcp_servers: [{name: m}]}]",
            "providers[0].mcp_servers[0].command: required for a stdio MCP server",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], mcp_servers: [{name: m, type: ws}]}]",
            "providers[0].mcp_servers[0].type",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], "
            "mcp_servers: [{name: m, type: http, url: 'file:///x'}]}]",
            "providers[0].mcp_servers[0].url",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], "
            "mcp_servers: [{name: m, command: c}, {name: m, command: d}]}]",
            "providers[0].mcp_servers[1].name: duplicate",
        ),
        (
            "providers: [{id: a, kind: stdio, command: [x], writable_paths: [rel]}]",
            "providers[0].writable_paths[0]",
        ),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(tmp_path, text)


def test_fs_confinement(tmp_path: Path) -> None:
    root = tmp_path / "root"
    proj = root / "proj"
    proj.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", proj / "escape")
    assert client_fs.confined_root(str(proj), (str(root),)) == str(proj)
    assert client_fs.confined_root(str(tmp_path), (str(root),)) is None
    assert client_fs.confined_root("relative", (str(root),)) is None
    assert client_fs.confined_root(str(proj), ()) is None
    sess = str(proj)
    assert client_fs.resolve(str(proj / "a.txt"), sess) == str(proj / "a.txt")
    for bad in (str(proj / "escape" / "x"), str(tmp_path / "x"), "rel/x", None):
        with pytest.raises(ClientError):
            client_fs.resolve(bad, sess)
    with pytest.raises(ClientError):
        client_fs.resolve(str(proj / "a.txt"), None)


async def test_fs_read_slices_and_missing(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("1\n2\n3\n4\n")
    root = str(tmp_path)
    got = await client_fs.read_text_file(
        {"path": str(tmp_path / "f.txt"), "line": 2, "limit": 2}, root, 100
    )
    assert got == {"content": "2\n3\n"}
    with pytest.raises(ClientError) as info:
        await client_fs.read_text_file({"path": str(tmp_path / "no.txt")}, root, 100)
    assert info.value.code == -32002
    with pytest.raises(ClientError):
        await client_fs.read_text_file({"path": str(tmp_path / "f.txt")}, root, 3)
    with pytest.raises(ClientError):
        await client_fs.write_text_file(
            {"path": str(tmp_path / "g.txt"), "content": "x" * 9}, root, 3
        )


def test_adapter_settings_from_original_env() -> None:
    s = AdapterSettings.from_env({})
    assert s.listen == "127.0.0.1:8791" and s.agent_bin == "gemini" and s.agent_args == ("--acp",)
    assert s.provider_id == "gemini" and s.provider_label == "Gemini" and s.protocol_version == 1
    assert s.allowed_origins == (
        "https://xworkmate.svc.plus",
        "http://localhost:*",
        "http://127.0.0.1:*",
    )
    s = AdapterSettings.from_env(
        {
            "ACP_GEMINI_BIN": "/opt/gemini",
            "GEMINI_ADAPTER_ARGS": "--acp --model 'a b'",
            "GEMINI_ADAPTER_PROVIDER_ID": "g2",
        }
    )
    assert s.agent_bin == "/opt/gemini" and s.agent_args == ("--acp", "--model", "a b")
    assert (
        AdapterSettings.from_env({"GEMINI_ADAPTER_BIN": "/x", "ACP_GEMINI_BIN": "/y"}).agent_bin
        == "/x"
    )
    with pytest.raises(ConfigError):
        AdapterSettings.from_env({"GEMINI_ADAPTER_PROTOCOL_VERSION": "0"})
    cfg = s.bridge_config(BridgeConfig())
    (only,) = cfg.providers
    assert only.id == "g2" and only.command == ("/opt/gemini", "--acp", "--model", "a b")
    assert only.fs_read is False  # gemini-cli cannot create files otherwise


def test_adapter_takes_its_provider_from_the_yaml() -> None:
    """Issue 15 item 10: label, command, env and cwd from providers:, with env vars
    and flags above them."""
    from dataclasses import replace

    yaml_provider = ProviderConfig(
        id="gemini",
        kind="stdio",
        label="My Gemini",
        command=("/opt/gemini", "--acp", "--model", "m1"),
        env=("GEMINI_API_KEY=k-123",),
        cwd="/srv/work",
    )
    base = replace(BridgeConfig(), providers=(yaml_provider,))
    (only,) = AdapterSettings.from_env({}).bridge_config(base).providers
    assert only.command == ("/opt/gemini", "--acp", "--model", "m1")
    assert only.label == "My Gemini" and only.env == ("GEMINI_API_KEY=k-123",)
    assert only.cwd == "/srv/work" and only.kind == "stdio"
    # an env var replaces the binary, the YAML arguments stay
    (env_bin,) = (
        AdapterSettings.from_env({"GEMINI_ADAPTER_BIN": "/usr/bin/gemini"})
        .bridge_config(base)
        .providers
    )
    assert env_bin.command == ("/usr/bin/gemini", "--acp", "--model", "m1")
    # flags above env vars; the label env var above the YAML label
    settings = AdapterSettings.from_env(
        {"GEMINI_ADAPTER_ARGS": "--acp", "GEMINI_ADAPTER_PROVIDER_LABEL": "G"},
        agent_args="--experimental-acp",
    )
    (flagged,) = settings.bridge_config(base).providers
    assert flagged.command == ("/opt/gemini", "--experimental-acp")
    assert flagged.label == "G"
    # no YAML provider: the original's defaults
    (default,) = AdapterSettings.from_env({}).bridge_config(BridgeConfig()).providers
    assert default.command == ("gemini", "--acp") and default.label == "Gemini"


async def test_fs_read_keeps_line_endings_so_a_write_back_changes_nothing(tmp_path: Path) -> None:
    """Reads used universal newlines: a CRLF file came back with LF only, and the agent
    writing its edit back silently converted every line ending of the file."""
    path = tmp_path / "win.txt"
    path.write_bytes(b"one\r\ntwo\r\nold\rthree\n")
    root = str(tmp_path)
    got = await client_fs.read_text_file({"path": str(path)}, root, 100)
    assert got == {"content": "one\r\ntwo\r\nold\rthree\n"}
    edited = got["content"].replace("two", "2")
    await client_fs.write_text_file({"path": str(path), "content": edited}, root, 100)
    assert path.read_bytes() == b"one\r\n2\r\nold\rthree\n"
    sliced = await client_fs.read_text_file({"path": str(path), "line": 2, "limit": 1}, root, 100)
    assert sliced == {"content": "2\r\n"}


async def test_fs_read_of_a_fifo_is_refused_not_a_hang(tmp_path: Path) -> None:
    """A FIFO inside the session directory (the agent can make one with its own shell)
    was opened in a worker thread that then blocked forever waiting for a writer; the
    thread also kept the daemon from exiting."""
    import asyncio

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ClientError) as info:
        await asyncio.wait_for(
            client_fs.read_text_file({"path": str(tmp_path / "pipe")}, str(tmp_path), 100), 5
        )
    assert "not a regular file" in info.value.message
    with pytest.raises(ClientError, match="not a regular file"):
        await client_fs.read_text_file({"path": str(tmp_path)}, str(tmp_path), 100)


async def test_fs_write_that_the_os_refuses_is_a_clear_error(tmp_path: Path) -> None:
    """A write onto a directory, under a file or into a read-only directory raised the
    OSError out of the handler: the agent got 'internal error', the log a traceback."""
    root = str(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    for target, why in (
        (tmp_path / "dir", "Is a directory"),
        (tmp_path / "file" / "child.txt", "Not a directory"),  # a file as the parent
    ):
        with pytest.raises(ClientError) as info:
            await client_fs.write_text_file({"path": str(target), "content": "y"}, root, 100)
        assert info.value.code == -32602
        assert info.value.message.startswith("cannot write") and why in info.value.message
    assert (tmp_path / "file").read_text() == "x"
    assert [n for n in os.listdir(tmp_path) if n.startswith(".xwm-write-")] == []
