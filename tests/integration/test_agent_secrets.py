"""No bridge secret reaches a local agent: the real environment (``/proc/<pid>/environ``)
of every process of the agent's tree (plain and under bwrap) and of the commands it
runs through ``terminal/create``, and no agent's key in the bridge's logs or replies
when the agent quotes it on stderr and dies; fs paths from the agent confined."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import ROOT, TOKEN, StartBridge, base_env
from tests.integration.agent_helpers import agent_params, agent_provider
from tests.integration.test_local_agents import fake_agent_on_path, turn
from tests.markers import needs_bwrap

pytestmark = pytest.mark.asyncio

#: every kind of bridge credential, each a distinct value
BRIDGE_SECRETS = {
    "ACP_AUTH_TOKEN": TOKEN,
    "XWM_CLIENT_TOKENS": "client-secret-aaa1,client-secret-bbb2",
    "XWM_ADMIN_TOKENS": "admin-secret-ccc3",
    "INTERNAL_SERVICE_TOKEN": "svc-secret-ddd4",
    "BRIDGE_AUTH_TOKEN": "bridge-secret-eee5",
    "XWM_OPENCLAW_TOKEN": "openclaw-secret-fff6",
    "LLM_API_KEY": "llm-secret-ggg7",
    "XWM_MULTI_AGENT_API_KEY": "multi-secret-hhh8",
    "VAULT_SERVER_ROOT_ACCESS_TOKEN": "vault-secret-iii9",
    # read by agent-adapter only: a serve daemon's config does not hold it, yet it is
    # the bridge's (and the gemini entry copies GEMINI_*)
    "GEMINI_ADAPTER_AUTH_TOKEN": "adapter-secret-jjj0",
}
#: not copied: an agent's environment has only the names its entry and pass_env list
PROXY = {"HTTPS_PROXY": "http://proxyuser:proxy-secret-kkk1@127.0.0.1:9", "NO_PROXY": "*"}


def secret_values() -> list[str]:
    out = [p for v in BRIDGE_SECRETS.values() for p in v.split(",")]
    return [*out, "proxy-secret-kkk1", "upstream-secret-lll2"]


def environs_with(marker: str) -> dict[int, str]:
    """pid → environment of every process (of this user) whose environment holds
    ``marker``: the agent, its bwrap wrapper and sandboxed children, its terminals."""
    out: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in data:
            out[int(entry)] = data.decode(errors="replace")
    return out


async def check_tree(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path, sandbox: str
) -> None:
    marker = f"xwm-marker-{uuid.uuid4().hex}"
    bin_dir = tmp_path / "bin"
    launcher = fake_agent_on_path(bin_dir, "gemini")
    work = tmp_path / "work"
    work.mkdir()
    provider = agent_provider(
        # PYTHONPATH keeps a checkout under /tmp (its venv) visible in the bwrap sandbox
        "gemini",
        command=[str(launcher)],
        env=[f"AGENT_MARKER={marker}", f"PYTHONPATH={ROOT}"],
    )  # a registry id: GEMINI_* and GOOGLE_* are copied
    upstream = {
        "id": "remote",
        "label": "Remote",
        "endpoint": "http://127.0.0.1:9/acp/rpc",
        "auth_header": "Bearer upstream-secret-lll2",
    }
    agents = {"terminal_enabled": True, "sandbox": sandbox}
    config = {"providers": [provider, upstream], "allowed_roots": [str(tmp_path)], "agents": agents}
    env = base_env(**BRIDGE_SECRETS, **PROXY, GEMINI_MODEL="g-model")
    bp = await start_bridge(config=config, env=env, tmp=tmp_path)
    wd = str(work)
    out = await turn(http, bp.rpc_url, agent_params("s1", "pid", "gemini", workingDirectory=wd))
    assert out["success"] is True, out
    tree = environs_with(marker)
    agent_pid = int(str(out["output"]).split()[1])
    if sandbox == "bwrap":  # the agent's pid is its own namespace's: find it by its env
        assert len(tree) >= 2, tree  # bwrap and the sandboxed agent (and its children)
    else:
        assert agent_pid in tree, tree
    for pid, environ in tree.items():
        assert "GEMINI_MODEL=g-model" in environ, pid  # what the entry copies does arrive
        for secret in secret_values():
            assert secret not in environ, (pid, secret)
    for name in (*BRIDGE_SECRETS, "HTTPS_PROXY"):
        assert all(f"\0{name}=" not in f"\0{e}" for e in tree.values()), name
    # a command the agent runs starts from the agent's own environment
    got = await turn(
        http, bp.rpc_url, agent_params("s1", "terminal /usr/bin/env", "gemini", workingDirectory=wd)
    )
    listing = str(got["output"])
    assert f"AGENT_MARKER={marker}" in listing, listing
    for secret in secret_values():
        assert secret not in listing, secret


async def test_no_bridge_secret_reaches_the_agents_processes(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await check_tree(start_bridge, http, tmp_path, "none")


@needs_bwrap
async def test_no_bridge_secret_reaches_the_sandboxed_agents_processes(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await check_tree(start_bridge, http, tmp_path, "bwrap")


async def test_an_agent_quoting_its_key_on_stderr_is_redacted(
    start_bridge_process: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The agent's own key (copied from the bridge's environment) is quoted in the
    exit message the turn reports and in the debug log of its stderr: both masked."""
    launcher = fake_agent_on_path(tmp_path / "bin", "gemini")
    config = {"providers": [agent_provider("gemini", command=[str(launcher)])]}
    key = "gemini-own-key-mmm3"
    env = base_env(ACP_AUTH_TOKEN=TOKEN, GEMINI_API_KEY=key)
    bp = await start_bridge_process("--log-level", "debug", env=env, config=config, tmp=tmp_path)
    out = await turn(http, bp.rpc_url, agent_params("k1", "leak GEMINI_API_KEY", "gemini"))
    assert out["success"] is False and "exited (exit status 5)" in out["error"], out
    assert "fatal: bad key [REDACTED]" in out["error"], out
    await bp.stop()
    assert any("fatal: bad key [REDACTED]" in line for line in bp.logs), bp.logs[-20:]
    assert not any(key in line for line in bp.logs)


async def test_fs_paths_from_the_agent_are_confined_to_the_session_directory(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """``..``, a symlink out, a relative path and an absolute path outside: each an error
    answer to the agent, and nothing is written outside."""
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside")
    (work / "out").symlink_to(outside)
    (work / "ok.txt").write_text("inside")
    config = {"providers": [agent_provider()], "allowed_roots": [str(work)]}
    bp = await start_bridge(config=config, tmp=tmp_path)
    wd = str(work)

    async def say(prompt: str) -> str:
        out = await turn(http, bp.rpc_url, agent_params("f1", prompt, workingDirectory=wd))
        return str(out["output"])

    assert await say(f"read {work / 'ok.txt'}") == "content: inside"
    for bad in (
        f"{work}/../outside/secret.txt",
        f"{work}/out/secret.txt",
        "ok.txt",
        str(outside / "secret.txt"),
    ):
        assert await say(f"read {bad}") == "read error -32602", bad
        assert await say(f"write {bad} escaped") == "write error", bad
    assert await say(f"write {work}/out/new/x.txt escaped") == "write error"
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "outside"
