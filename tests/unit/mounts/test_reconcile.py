"""xworkmate.mounts.reconcile (adapters.md §4) on temp homes: every target, the
managed block, confinement to configured homes, malformed files, concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.markers import both_loops
from tests.processes import alive
from xwm_bridge.config import MountsConfig
from xwm_bridge.mounts.managed import BEGIN, END, McpServer, merge, render_block, timestamp
from xwm_bridge.mounts.reconcile import (
    MAX_CLI_OUTPUT,
    MountsRequest,
    count_cli_servers,
    reconcile,
    run_cli,
)

SERVER = {"id": "xworkmate_server", "command": "xworkmate-mcp", "args": ["--port", "7777"]}
USER_CONFIG = '# user settings\nmodel = "o3"\n\n[mcp_servers.user_server]\ncommand = "u"\n'


def exe(path: Path, body: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport sys, pathlib\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    homes = {name: tmp_path / "homes" / name for name in ("codex", "opencode", "openclaw")}
    return {"bin": bin_dir, "tmp": tmp_path, **homes}


def cfg(env: dict[str, Path], **kw: Any) -> MountsConfig:
    return MountsConfig(
        codex_home=str(env["codex"]),
        opencode_home=str(env["opencode"]),
        openclaw_home=str(env["openclaw"]),
        **kw,
    )


def run(params: dict[str, Any], config: MountsConfig) -> dict[str, Any]:
    return asyncio.run(reconcile(MountsRequest.parse(params), config))


def targets(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["targetId"]: t for t in result["mountTargets"]}


def test_nothing_installed(env: dict[str, Path]) -> None:
    result = run({}, cfg(env))
    assert [t["targetId"] for t in result["mountTargets"]] == [
        "aris", "codex", "claude", "gemini", "opencode", "openclaw",
    ]  # fmt: skip
    assert result["arisCompatStatus"] == "missing" and result["arisBundleVersion"] == ""
    t = targets(result)
    assert t["aris"]["detail"] == "Embedded ARIS bundle is unavailable."
    assert (
        t["codex"]["syncState"] == "missing" and t["codex"]["detail"] == "LLM API not configured."
    )
    assert t["claude"]["syncState"] == "disabled"
    assert t["openclaw"]["supportsMcp"] is False
    assert not env["codex"].exists()  # nothing written


def test_example_13_codex_rewrite(env: dict[str, Path]) -> None:
    cli = exe(env["tmp"] / "opt" / "codex")
    env["codex"].mkdir(parents=True)
    config_file = env["codex"] / "config.toml"
    config_file.write_text(USER_CONFIG)
    config_file.chmod(0o600)
    params = {
        "config": {"autoSync": True, "usesAris": True, "managedMcpServers": [SERVER]},
        "aiGatewayUrl": "https://llm.example.com",
        "configuredCodexCliPath": str(cli),
        "codexHome": str(env["codex"]),
        "aris": {
            "available": True,
            "bundleVersion": "2026.04.1",
            "llmChatServerPath": "/app/aris/mcp-server.py",
            "skillCount": 12,
            "bridgeAvailable": True,
        },
    }
    result = run(params, cfg(env))
    assert result["arisCompatStatus"] == "ready"
    t = targets(result)
    assert t["aris"] == {
        "targetId": "aris", "label": "ARIS", "available": True, "supportsSkills": True,
        "supportsMcp": True, "supportsAiGatewayInjection": False, "discoveryState": "ready",
        "syncState": "ready", "discoveredSkillCount": 12, "discoveredMcpCount": 1,
        "managedMcpCount": 1,
        "detail": "Embedded bundle 2026.04.1 ready; XWorkmate Go core manages llm-chat and "
        "claude-review.",
    }  # fmt: skip
    assert t["codex"] == {
        "targetId": "codex", "label": "Codex", "available": True, "supportsSkills": True,
        "supportsMcp": True, "supportsAiGatewayInjection": True, "discoveryState": "ready",
        "syncState": "ready", "discoveredSkillCount": 0, "discoveredMcpCount": 1,
        "managedMcpCount": 1,
        "detail": "LLM API uses launch-scoped defaults for collaboration runs.",
    }  # fmt: skip
    text = config_file.read_text()
    assert text.startswith(USER_CONFIG.rstrip("\n") + "\n\n" + BEGIN + "\n")
    assert (
        '[mcp_servers.xworkmate_server]\ncommand = "xworkmate-mcp"\nargs = ["--port", "7777"]\n'
        in text
    )
    assert text.endswith(END + "\n")
    doc = tomllib.loads(text)
    assert set(doc["mcp_servers"]) == {"user_server", "xworkmate_server"}
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600  # permissions kept
    assert (env["codex"] / "config.toml.bak").read_text() == USER_CONFIG
    # a second run replaces the block instead of adding one
    again = targets(run(params, cfg(env)))["codex"]
    assert again["discoveredMcpCount"] == 2  # counted before the rewrite, managed included
    assert config_file.read_text().count(BEGIN) == 1


def test_codex_available_only_for_an_executable(env: dict[str, Path]) -> None:
    plain = env["tmp"] / "notes.txt"
    plain.write_text("x")
    params = {"configuredCodexCliPath": str(plain), "config": {"autoSync": True,
              "managedMcpServers": [SERVER]}}  # fmt: skip
    assert targets(run(params, cfg(env)))["codex"]["available"] is False
    exe(env["bin"] / "codex")
    assert targets(run(params, cfg(env)))["codex"]["available"] is True


def test_client_home_outside_configured_home_is_not_touched(env: dict[str, Path]) -> None:
    exe(env["bin"] / "codex")
    outside = env["tmp"] / "victim"
    outside.mkdir()
    params = {
        "config": {"autoSync": True, "managedMcpServers": [SERVER]},
        "codexHome": str(outside),
    }
    t = targets(run(params, cfg(env)))["codex"]
    assert not (outside / "config.toml").exists()
    assert (env["codex"] / "config.toml").exists()
    assert "outside the configured tool home" in t["detail"]
    # a sub-directory of the configured home is accepted
    sub = env["codex"] / "profile"
    run({**params, "codexHome": str(sub)}, cfg(env))
    assert (sub / "config.toml").exists()


def test_a_client_home_swapped_for_a_symlink_after_the_check_is_not_written_through(
    env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory between the configured home and the client's ``codexHome`` swapped
    for a symlink out of the home after the check (a writer in the home, such as a
    sandboxed agent whose state dir it is): the config, its lock, temp file and
    ``.bak`` were made by path, so they landed outside. Now the directory is opened
    beneath the home without following a symlink and the write fails."""
    from xwm_bridge.mounts import reconcile as module

    exe(env["bin"] / "codex")
    (env["codex"] / "profiles" / "a").mkdir(parents=True)
    outside = env["tmp"] / "victim"
    (outside / "a").mkdir(parents=True)
    (outside / "a" / "config.toml").write_text(USER_CONFIG)
    check = module.tool_home

    def racing(configured: str, default_name: str, requested: str) -> Any:
        chosen = check(configured, default_name, requested)
        if requested:
            (env["codex"] / "profiles").rename(env["codex"] / "profiles.old")
            (env["codex"] / "profiles").symlink_to(outside)
        return chosen

    monkeypatch.setattr(module, "tool_home", racing)
    params = {
        "config": {"autoSync": True, "managedMcpServers": [SERVER]},
        "codexHome": str(env["codex"] / "profiles" / "a"),
    }
    t = targets(run(params, cfg(env)))["codex"]
    assert t["syncState"] == "error" and "could not be updated" in t["detail"]
    assert sorted(os.listdir(outside / "a")) == ["config.toml"]
    assert (outside / "a" / "config.toml").read_text() == USER_CONFIG


@pytest.mark.parametrize(
    "existing",
    [
        "this is = = not toml\n[",
        f"{BEGIN}\n[mcp_servers.x]\ncommand = 'a'\n",  # orphan start marker
        '[mcp_servers.xworkmate_server]\ncommand = "mine"\n',  # conflicting user table
    ],
)
def test_unmergeable_existing_config_is_reported_and_untouched(
    env: dict[str, Path], existing: str
) -> None:
    exe(env["bin"] / "codex")
    env["codex"].mkdir(parents=True)
    (env["codex"] / "config.toml").write_text(existing)
    params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
    t = targets(run(params, cfg(env)))["codex"]
    assert t["syncState"] == "error"
    assert "left untouched" in t["detail"]
    assert (env["codex"] / "config.toml").read_text() == existing
    assert not (env["codex"] / "config.toml.bak").exists()


def test_ids_and_strings_are_escaped(env: dict[str, Path]) -> None:
    exe(env["bin"] / "codex")
    evil = {"id": 'x]\n[evil]\nk = "', "command": 'a"\nb', "args": ["\\", '"']}
    run({"config": {"autoSync": True, "managedMcpServers": [evil]}}, cfg(env))
    doc = tomllib.loads((env["codex"] / "config.toml").read_text())
    assert list(doc) == ["mcp_servers"]
    assert doc["mcp_servers"][evil["id"]] == {"command": 'a"\nb', "args": ["\\", '"']}


def test_opencode_format(env: dict[str, Path]) -> None:
    exe(env["bin"] / "opencode")
    servers = [
        {"id": "b", "url": "http://127.0.0.1:9/mcp"},
        {"id": "a", "command": "run", "args": ["x"]},
        {"id": "off", "command": "z", "enabled": "false"},
    ]
    t = targets(run({"config": {"autoSync": "yes", "managedMcpServers": servers}}, cfg(env)))
    assert t["opencode"]["managedMcpCount"] == 2 and t["opencode"]["syncState"] == "ready"
    text = (env["opencode"] / "config.toml").read_text()
    assert text.index("[mcp_servers.a]") < text.index("[mcp_servers.b]")
    doc = tomllib.loads(text)["mcp_servers"]
    assert doc == {"a": {"type": "stdio", "command": "run", "args": ["x"]},
                   "b": {"url": "http://127.0.0.1:9/mcp"}}  # fmt: skip


def test_concurrent_double_reconcile_does_not_corrupt(env: dict[str, Path]) -> None:
    exe(env["bin"] / "codex")
    env["codex"].mkdir(parents=True)
    (env["codex"] / "config.toml").write_text(USER_CONFIG)
    config = cfg(env)

    async def both() -> None:
        params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
        await asyncio.gather(*(reconcile(MountsRequest.parse(params), config) for _ in range(6)))

    asyncio.run(both())
    text = (env["codex"] / "config.toml").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    assert set(tomllib.loads(text)["mcp_servers"]) == {"user_server", "xworkmate_server"}
    assert [p.name for p in env["codex"].iterdir() if p.name.endswith(".tmp")] == []


def test_cli_discovery_only_when_enabled(env: dict[str, Path]) -> None:
    marker = env["tmp"] / "ran"
    body = (
        f"pathlib.Path({str(marker)!r}).touch()\n"
        "print('┌ header'); print('srv-one: ok'); print('srv-two: ok'); print('Usage: x')"
    )
    exe(env["bin"] / "claude", body)
    exe(env["bin"] / "gemini", "print('No MCP servers configured')")
    params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
    t = targets(run(params, cfg(env)))
    assert t["claude"]["available"] and t["claude"]["syncState"] == "launch-only"
    assert t["claude"]["discoveredMcpCount"] == 0 and not marker.exists()
    t = targets(run(params, cfg(env, cli_discovery_enabled=True)))
    assert marker.exists()
    assert t["claude"]["discoveredMcpCount"] == 2
    assert t["gemini"]["discoveredMcpCount"] == 0
    assert (
        t["gemini"]["detail"]
        == "MCP discovery uses `gemini mcp list`; LLM API stays launch-scoped."
    )


def test_cli_discovery_deadline(env: dict[str, Path]) -> None:
    exe(env["bin"] / "claude", "import time; time.sleep(30)")
    import time

    started = time.monotonic()
    t = targets(run({}, cfg(env, cli_discovery_enabled=True, cli_timeout=0.5)))
    assert time.monotonic() - started < 5
    assert t["claude"]["discoveredMcpCount"] == 0


def test_cli_discovery_output_is_read_up_to_the_cap(env: dict[str, Path]) -> None:
    """A CLI that prints more than MAX_CLI_OUTPUT is read up to the cap and killed; its
    output was read whole into memory until the deadline, then thrown away."""
    body = (
        "import time\n"
        "for i in range(200000): sys.stdout.write(f'srv-{i}: ok\\n')\n"
        "sys.stdout.flush(); time.sleep(60)"
    )
    exe(env["bin"] / "claude", body)
    t = targets(run({}, cfg(env, cli_discovery_enabled=True, cli_timeout=20)))
    assert t["claude"]["discoveredMcpCount"] > 50_000  # the first MiB of lines


def test_discovery_commands_of_concurrent_reconciles_share_a_few_places(
    env: dict[str, Path],
) -> None:
    """Each reconcile started its ``claude``/``gemini mcp list`` at once, however many
    ran (256 in flight per connection): now at most the places given run together, and
    one that finds none within its deadline counts nothing instead of starting."""
    log = env["tmp"] / "started"
    hang = f"open({str(log)!r}, 'a').write('x\\n'); import time; time.sleep(30)"
    for name in ("claude", "gemini"):
        exe(env["bin"] / name, hang)
    config = cfg(env, cli_discovery_enabled=True, cli_timeout=1.0)

    async def three(places: asyncio.Semaphore) -> list[dict[str, Any]]:
        req = MountsRequest.parse({})
        return await asyncio.gather(*(reconcile(req, config, places) for _ in range(3)))

    results = asyncio.run(three(asyncio.Semaphore(2)))
    assert log.read_text() == "x\n" * 2  # 2 of the 6 commands started
    assert all(targets(r)["claude"]["discoveredMcpCount"] == 0 for r in results)
    # a place freed in time is taken by the next one waiting
    for name in ("claude", "gemini"):
        exe(env["bin"] / name, f"open({str(log)!r}, 'a').write('y\\n'); print('srv: ok')")
    log.unlink()
    results = asyncio.run(three(asyncio.Semaphore(1)))
    assert log.read_text() == "y\n" * 6
    assert all(targets(r)["gemini"]["discoveredMcpCount"] == 1 for r in results)


def test_managed_servers_and_their_args_are_capped() -> None:
    """tomlkit renders tables and arrays in quadratic time: a request of thousands of
    servers, or of one server with thousands of args, held a worker thread (and the
    config's lock) for minutes to hours. Past the caps the request is -32602."""
    from xwm_bridge.jsonrpc import RpcError

    def params(servers: list[dict[str, Any]]) -> dict[str, Any]:
        return {"config": {"autoSync": True, "managedMcpServers": servers}}

    most = [{"id": f"s{i}", "command": "c"} for i in range(256)]
    assert len(MountsRequest.parse(params([*most, {"name": "no id: skipped"}])).servers) == 256
    with pytest.raises(RpcError, match="at most 256 servers") as caught:
        MountsRequest.parse(params([*most, {"id": "one more", "command": "c"}]))
    assert caught.value.code == -32602
    args = [str(i) for i in range(256)]
    assert MountsRequest.parse(params([{"id": "s", "args": args}])).servers[0].args[-1] == "255"
    with pytest.raises(RpcError, match=r"managedMcpServers\[1\]\.args: at most 256"):
        MountsRequest.parse(params([{"id": "a"}, {"id": "s", "args": [*args, "x"]}]))
    four = [{"id": f"s{i}", "args": args} for i in range(4)]  # 256 servers of 256: 13 s
    assert len(MountsRequest.parse(params(four)).servers) == 4
    with pytest.raises(RpcError, match="at most 1024 args in all"):
        MountsRequest.parse(params([*four, {"id": "s4", "args": ["x"]}]))


def test_openclaw_inspection(env: dict[str, Path]) -> None:
    exe(env["bin"] / "openclaw")
    (env["openclaw"] / "skills" / "a").mkdir(parents=True)
    (env["openclaw"] / "skills" / "b").mkdir()
    (env["openclaw"] / "openclaw.json").write_text('{"agents":{"list":[{},{},{}]}}')
    t = targets(run({"config": {"autoSync": True}}, cfg(env)))["openclaw"]
    assert t["syncState"] == "launch-only" and t["discoveredSkillCount"] == 2
    assert t["detail"] == "agents: 3 · skills: 2"
    (env["openclaw"] / "openclaw.json").write_text("[1]")
    t = targets(run({}, cfg(env)))["openclaw"]
    assert t["detail"] == "OpenClaw config detected but could not be fully parsed."


@pytest.mark.parametrize(
    ("aris", "uses", "state", "detail"),
    [
        ({"error": "boom", "available": True}, True, "error", "boom"),
        ({"available": True, "llmChatServerPath": "/p"}, False, "embedded",
         "Embedded bundle extracted, but the XWorkmate Go core is not available yet."),
        ({"available": "true", "skillCount": "-3"}, True, "embedded",
         "Embedded bundle extracted, but llm-chat metadata is missing."),
    ],
)  # fmt: skip
def test_aris_rules(
    env: dict[str, Path], aris: dict[str, Any], uses: bool, state: str, detail: str
) -> None:
    t = targets(run({"aris": aris, "config": {"usesAris": uses}}, cfg(env)))["aris"]
    assert (t["syncState"], t["detail"]) == (state, detail)
    assert t["discoveredSkillCount"] == 0


@pytest.mark.parametrize(
    "params",
    [
        {"config": "yes"},
        {"config": {"autoSync": [1], "usesAris": {}, "managedMcpServers": "x"}},
        {"config": {"managedMcpServers": [1, None, {"id": ""}, {"id": 7, "args": "a"}]}},
        {"aiGatewayUrl": 5, "configuredCodexCliPath": ["x"], "codexHome": {"a": 1}},
        {"opencodeHome": 3, "openclawHome": None},
        {"aris": "x"},
        {"aris": {"available": [], "bundleVersion": 1.5, "skillCount": "12abc", "error": None}},
    ],
)
def test_wrong_types_are_coerced(env: dict[str, Path], params: dict[str, Any]) -> None:
    result = run(params, cfg(env))
    assert len(result["mountTargets"]) == 6


def test_block_format_and_timestamp() -> None:
    stamp = timestamp(1_700_000_000_123_456_789)
    assert stamp.split(".")[1].startswith("123456789")
    block = render_block([McpServer("s", command="c")], "codex", 1_700_000_000_123_456_789)
    assert block.splitlines()[:4] == [
        BEGIN,
        "# Generated by XWorkmate - Managed MCP Server Configuration",
        f"# Last updated: {stamp}",
        "",
    ]
    assert merge("", [McpServer("s", command="c")], "codex").startswith(BEGIN)


def test_home_defaults_follow_home(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(env["tmp"]))
    exe(env["bin"] / "codex")
    run({"config": {"autoSync": True, "managedMcpServers": [SERVER]}}, MountsConfig())
    assert (env["tmp"] / ".codex" / "config.toml").exists()
    monkeypatch.delenv("HOME")
    t = targets(run({"config": {"autoSync": True, "managedMcpServers": [SERVER]}}, MountsConfig()))
    assert t["codex"]["syncState"] == "ready"  # nothing to write to, nothing written
    assert os.getcwd() != ""


def test_cli_discovery_runs_without_the_bridges_secrets(
    env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``<cli> mcp list`` (a third-party CLI, and the MCP servers it may start) sees
    the bridge's environment minus its secrets, and minus copies of them."""
    monkeypatch.setenv("ACP_AUTH_TOKEN", "bridge-token-123456")
    monkeypatch.setenv("LLM_API_KEY", "llm-key-abcdef")
    monkeypatch.setenv("COPIED_TOKEN", "bridge-token-123456")
    monkeypatch.setenv("HARMLESS", "kept")
    seen = env["tmp"] / "env.json"
    body = f"import os, json; pathlib.Path({str(seen)!r}).write_text(json.dumps(dict(os.environ)))"
    exe(env["bin"] / "claude", body)
    run({"config": {"autoSync": True}}, cfg(env, cli_discovery_enabled=True))
    child = json.loads(seen.read_text())
    assert child["HARMLESS"] == "kept" and child["PATH"] == str(env["bin"])
    assert not {"ACP_AUTH_TOKEN", "LLM_API_KEY", "COPIED_TOKEN"} & set(child)


def test_per_file_locks_are_dropped_when_released(env: dict[str, Path]) -> None:
    """The thread lock of each config path is forgotten once no reconcile holds or waits
    for it: the paths are client-chosen (any directory inside the tool home), and every
    one seen was kept for the daemon's life."""
    from xwm_bridge.mounts import files

    exe(env["bin"] / "codex")
    for i in range(3):
        params = {
            "codexHome": str(env["codex"] / f"sub{i}"),
            "config": {"autoSync": True, "managedMcpServers": [SERVER]},
        }
        assert targets(run(params, cfg(env)))["codex"]["syncState"] == "ready"
        assert (env["codex"] / f"sub{i}" / "config.toml").exists()
    assert files._LOCKS == {}
    path = env["codex"] / "config.toml"
    with files.Locked(path), files.Locked(env["codex"] / "other.toml"):
        assert set(files._LOCKS) == {str(path), str(env["codex"] / "other.toml")}
    assert files._LOCKS == {}


def _bounded(params: dict[str, Any], config: MountsConfig, unblock: Any) -> dict[str, Any]:
    """``reconcile`` within 10 s; past it ``unblock()`` frees the stuck worker thread (a
    thread cannot be cancelled) and the test fails instead of hanging."""

    async def go() -> dict[str, Any]:
        task = asyncio.ensure_future(reconcile(MountsRequest.parse(params), config))
        done, _ = await asyncio.wait({task}, timeout=10)
        if not done:
            unblock()
            await task
            pytest.fail("reconcile did not finish")
        return task.result()

    return asyncio.run(go())


def test_a_fifo_named_like_a_managed_file_is_refused_not_waited_on(
    env: dict[str, Path],
) -> None:
    """A FIFO at ``config.toml`` or ``openclaw.json`` made the reconcile (and its worker
    thread) wait for a writer for ever; it is opened without blocking and refused."""
    exe(env["bin"] / "codex")
    exe(env["bin"] / "openclaw")
    fifos = [env["codex"] / "config.toml", env["openclaw"] / "openclaw.json"]
    for fifo in fifos:
        fifo.parent.mkdir(parents=True)
        os.mkfifo(fifo)

    def unblock() -> None:  # a writer that closes at once: the blocked read sees EOF
        for fifo in fifos:
            with contextlib.suppress(OSError):  # ENXIO: nobody is reading that one
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
    t = targets(_bounded(params, cfg(env), unblock))
    assert t["codex"]["syncState"] == "error"
    detail = f"{fifos[0]} could not be updated: {fifos[0]} is not a regular file"
    assert t["codex"]["detail"] == detail
    assert stat.S_ISFIFO(os.lstat(fifos[0]).st_mode)  # left as it is, nothing written
    assert not (env["codex"] / "config.toml.bak").exists()
    assert t["openclaw"]["detail"] == "OpenClaw acts as the host/control plane mount."
    # read only (no autoSync): nothing counted, no wait either
    t = targets(_bounded({}, cfg(env), unblock))
    assert t["codex"]["discoveredMcpCount"] == 0


@pytest.mark.parametrize("holder", ["another process", "another thread"])
def test_a_stuck_lock_holder_fails_the_write_at_the_deadline(
    env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, holder: str
) -> None:
    """``Locked`` waited on its thread lock and on ``flock(LOCK_EX)`` with no deadline: a
    stuck holder (another bridge, a hung NFS server) held the reconcile for ever."""
    from xwm_bridge.mounts import files

    monkeypatch.setattr(files, "LOCK_TIMEOUT", 0.3)
    exe(env["bin"] / "codex")
    env["codex"].mkdir(parents=True)
    path = env["codex"] / "config.toml"
    path.write_text(USER_CONFIG)
    lock_path = env["codex"] / ".config.toml.xworkmate.lock"
    with contextlib.ExitStack() as held:
        if holder == "another process":  # flock is per open file: another fd is enough
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            held.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            held.enter_context(files.Locked(path))
        params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
        t = targets(_bounded(params, cfg(env), held.close))["codex"]
    assert t["syncState"] == "error"
    assert t["detail"] == (
        f"{path} could not be updated: {lock_path} is held by another writer (waited 0.3 s)"
    )
    assert path.read_text() == USER_CONFIG  # untouched
    assert files._LOCKS == {}  # the waiter that gave up left no entry behind
    # once the holder is gone the next reconcile writes
    params = {"config": {"autoSync": True, "managedMcpServers": [SERVER]}}
    assert targets(run(params, cfg(env)))["codex"]["syncState"] == "ready"
    assert path.read_text().count(BEGIN) == 1


@both_loops
async def test_a_cli_that_leaves_a_child_on_its_output_is_read_at_once(tmp_path: Path) -> None:
    """``<cli> mcp list`` that prints, exits and leaves a child holding its stdout: the
    list counts at once (not "" at the deadline), and the child is killed."""
    pid_file = tmp_path / "child.pid"
    body = (
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
        "print('srv-one: ok'); print('srv-two: ok')"
    )
    cli = exe(tmp_path / "claude", body)
    loop = asyncio.get_running_loop()
    started = loop.time()
    out = await run_cli(str(cli), 8)
    assert loop.time() - started < 5
    assert count_cli_servers(out) == 2
    child = int(pid_file.read_text())
    await wait_until(lambda: not alive(child))


@both_loops
async def test_a_cli_past_its_deadline_or_its_cap(tmp_path: Path) -> None:
    slow = exe(tmp_path / "slow", "import time; print('srv: ok', flush=True); time.sleep(30)")
    assert await run_cli(str(slow), 0.5) == ""
    flood = exe(
        tmp_path / "flood",
        "import time\nsys.stdout.write('srv: ok\\n' * 200000); sys.stdout.flush(); time.sleep(60)",
    )
    assert len(await run_cli(str(flood), 20)) == MAX_CLI_OUTPUT
