"""``xwm-bridge client`` (issue 13) as a process against the real daemon."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.conftest import ROOT, TOKEN, FakeUpstream, StartBridge, base_env, eventually, rpc
from tests.integration.agent_helpers import agent_params, agent_provider


async def client(
    url: str, *args: str, token: str = TOKEN, stdin: bytes = b"", wait_s: float = 60
) -> tuple[int, str, str]:
    env = base_env(ACP_AUTH_TOKEN=token)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "client", "--url", url, *args,
        env=env, cwd=str(ROOT), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), wait_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def config(tmp: Path, fake_url: str) -> dict[str, Any]:
    return {
        "providers": [
            {"id": "codex", "label": "Codex", "endpoint": f"{fake_url}/acp/rpc"},
            agent_provider(),
        ],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20},
    }


async def test_run_list_and_a_wrong_token(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path, fake_upstream.url), tmp=tmp_path)
    code, out, err = await client(
        bp.url, "run", "--provider", "codex", "--session", "cli-1", "hello there"
    )
    assert code == 0, err
    assert out.strip() == "echo: hello there"
    assert "turn ok" in err
    code, out, err = await client(bp.url, "run", "--provider", "codex", "error")
    assert code == 1 and "turn failed" in err
    code, out, _ = await client(bp.url, "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["SESSION", "STATE", "PROVIDER"]
    assert any(line.startswith("cli-1") and "completed" in line for line in lines)
    # --json: bidi and C1 controls in a prompt come out as JSON escapes, not raw (a
    # terminal showing them reorders or rewrites the line); the value is the same
    prompt = "see x\u202egnp.png \x9b2J \u2028end"
    code, _, err = await client(bp.url, "run", "--provider", "codex", "--session", "cli-2", prompt)
    assert code == 0, err
    code, out, err = await client(bp.url, "list", "--json")
    assert code == 0, err
    assert not set(out) & {"\u202e", "\x9b", "\u2028"}, out
    listed = {s["sessionId"]: s for s in orjson.loads(out)["sessions"]}
    assert listed["cli-2"]["lastTurn"]["prompt"] == prompt
    code, _, err = await client(bp.url, "list", token="wrong")
    assert code == 1 and "refused the token" in err
    code, _, err = await client("http://127.0.0.1:1", "list")
    assert code == 1 and "cannot reach the bridge" in err


async def test_a_bridge_it_cannot_reach_is_one_clear_line() -> None:
    # the URL and the reason, without aiohttp's "Cannot connect to host …ssl:default"
    code, out, err = await client("nonsense", "list")
    assert (code, out) == (1, "")
    (line,) = err.strip().splitlines()
    # the resolver's reason ("name or service not known"; offline resolvers differ)
    prefix = "xwm-bridge: cannot reach the bridge at ws://nonsense/acp: "
    assert line.startswith(prefix) and line.removeprefix(prefix).islower(), line
    assert "ssl:" not in line and "[" not in line, line
    code, _, err = await client("http://127.0.0.1:1", "list")
    assert code == 1
    assert err.strip() == (
        "xwm-bridge: cannot reach the bridge at ws://127.0.0.1:1/acp: connection refused"
    ), err


async def test_run_prompts_for_a_permission(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path, fake_upstream.url), tmp=tmp_path)
    target = tmp_path / "from-cli.txt"
    code, out, err = await client(
        bp.url, "run", "--provider", "fake", "--cwd", str(tmp_path), f"permission {target}",
        stdin=b"1\n",
    )  # fmt: skip
    assert code == 0, err
    assert "permission perm-" in err and "1) Allow [allow_once]" in err
    assert "permission granted (once)" in out
    assert target.exists()


async def test_watch_and_approve(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bp = await start_bridge(config=config(tmp_path, fake_upstream.url), tmp=tmp_path)
    watcher = asyncio.ensure_future(
        client(bp.url, "watch", "--kinds", "permission", "--count", "2")
    )

    async def subscribed() -> bool:  # the watcher process is following the live feed
        health = (await rpc(http, bp.rpc_url, "bridge.health", {}))["result"]
        return bool(health["metrics"]["watchers"] >= 1)

    await eventually(subscribed, within=30)
    target = tmp_path / "approved.txt"
    turn = asyncio.ensure_future(
        rpc(
            http,
            bp.rpc_url,
            "session.start",
            agent_params("ap-1", f"permission {target}", workingDirectory=str(tmp_path)),
        )
    )

    async def pending() -> list[dict[str, Any]]:
        reply = await rpc(http, bp.rpc_url, "permission.list", {})
        requests: list[dict[str, Any]] = reply["result"]["requests"]
        return requests

    request_id = (await eventually(pending))[0]["requestId"]
    assert request_id
    code, out, err = await client(bp.url, "approve", request_id, "once")
    assert code == 0, err
    assert out.strip() == f"{request_id}: allow_once"
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"]
    code, out, err = await client(bp.url, "approve", request_id, "once")
    assert code == 1 and "no pending permission request" in err
    code, out, err = await asyncio.wait_for(watcher, 30)
    assert code == 0, err
    lines = out.splitlines()
    assert f"permission {request_id} asks" in lines[0] and "[once, always, reject]" in lines[0]
    assert f"permission {request_id} allow_once by ws 127.0.0.1:" in lines[1]


async def test_a_config_with_admin_tokens_only_gives_the_client_its_token(
    start_bridge: StartBridge,
) -> None:
    """The client took auth_token only: with the daemon's own environment (admin
    tokens, no ACP_AUTH_TOKEN) it sent none and was refused ("set ACP_AUTH_TOKEN")."""
    admin = "admin-token-0123456789abcdef"
    env = base_env(XWM_ADMIN_TOKENS=admin, XWM_SESSION_STORE="memory")
    env.pop("ACP_AUTH_TOKEN", None)
    bp = await start_bridge(env=env)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "client", "--url", bp.url, "list",
        env=env, cwd=str(ROOT), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "no sessions"
