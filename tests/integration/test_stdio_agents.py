"""Stdio ACP agents behind ``serve``, against the scripted agent in internal/peers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import ROOT, TOKEN, StartBridge, base_env, log_entries, rpc
from tests.integration.agent_helpers import (
    agent_params,
    agent_provider,
    deltas,
    sse_stream,
    typed,
)
from xwm_bridge.core import handles

pytestmark = pytest.mark.asyncio


def config(tmp: Path, **agents: Any) -> dict[str, Any]:
    return {
        "providers": [agent_provider()],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20, **agents},
    }


async def collect(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    return [e async for e in sse_stream(http, url, method, params)]


async def test_prompt_streams_and_session_is_reused(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    caps = await rpc(http, bp.rpc_url, "acp.capabilities", {})
    assert {"providerId": "fake", "label": "Fake Agent"} in caps["result"]["providerCatalog"]

    events = await collect(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("s1", "hello", workingDirectory=str(tmp_path)),
    )
    result = events[-1]["result"]
    assert deltas(events) == "agent says: hello"
    assert typed(events, "plan")[0]["entries"][0]["content"] == "answer"
    assert typed(events, "usage")[0]["usage"] == {"used": 42, "size": 1000}
    assert result["success"] is True
    assert result["stopReason"] == "end_turn"
    assert result["output"] == "agent says: hello"
    assert result["provider"] == "fake"
    assert result["effectiveWorkingDirectory"] == str(tmp_path)
    seqs = [e["params"]["seq"] for e in events[:-1] if "seq" in e["params"]]
    assert seqs == sorted(seqs) and seqs[0] == 1
    first = result["agentSessionId"]

    events = await collect(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("s1", "again", workingDirectory=str(tmp_path)),
    )
    assert events[-1]["result"]["agentSessionId"] == first
    assert events[-1]["result"]["output"] == "agent says: again"

    events = await collect(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("s1", "fresh", workingDirectory=str(tmp_path)),
    )
    assert events[-1]["result"]["agentSessionId"] != first

    # plain JSON works too (no notifications)
    plain = await rpc(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("s1", "json", workingDirectory=str(tmp_path)),
    )
    assert plain["result"]["output"] == "agent says: json"


async def test_permission_approved_by_client(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    target = tmp_path / "out.txt"
    events: list[dict[str, Any]] = []
    answered: list[dict[str, Any]] = []
    async for event in sse_stream(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("p1", f"permission {target}", workingDirectory=str(tmp_path)),
    ):
        events.append(event)
        params = event.get("params", {})
        if (
            event.get("method") == "session.update"
            and params.get("type") == "permission"
            and params.get("pending")
        ):
            kinds = {o["kind"]: o["optionId"] for o in params["options"]}
            assert params["toolCall"]["kind"] == "edit"
            answered.append(
                await rpc(
                    http,
                    bp.rpc_url,
                    "session.permission",
                    {
                        "sessionId": "p1",
                        "requestId": params["requestId"],
                        "optionId": kinds["allow_once"],
                    },
                )
            )
    assert answered and answered[0]["result"]["accepted"] is True
    result = events[-1]["result"]
    assert result["success"] is True
    assert "permission granted (once)" in result["output"]
    assert target.read_text() == "written by fake agent\n"
    assert result["permissions"][0]["outcome"] == "allow_once"
    assert result["permissions"][0]["decision"] == "ask"
    assert [u["status"] for u in typed(events, "tool_call_update")] == ["completed"]


async def test_permission_rejected_by_policy(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    rules = [
        {"action": "reject", "kind": "edit", "path": "*.txt"},
        {"action": "allow", "kind": "*"},
    ]
    bp = await start_bridge(config=config(tmp_path, permission_rules=rules), tmp=tmp_path)
    target = tmp_path / "nope.txt"
    events = await collect(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("p2", f"permission {target}", workingDirectory=str(tmp_path)),
    )
    result = events[-1]["result"]
    assert not target.exists()
    assert "permission denied" in result["output"]
    record = result["permissions"][0]
    assert record["decision"] == "reject" and record["outcome"] == "reject_once"
    assert "rule 1" in record["reason"]
    # the allow rule picks allow_once, never allow_always
    other = tmp_path / "ok.md"
    events = await collect(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("p2", f"permission {other}", workingDirectory=str(tmp_path)),
    )
    assert "permission granted (once)" in events[-1]["result"]["output"]
    assert other.exists()


async def test_ask_without_stream_and_unanswered_ask_reject(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # a `streamless` rule keeps rejecting plain-JSON HTTP turns (they wait otherwise)
    rules = [{"action": "reject", "kind": "*", "path": "*", "streamless": True}]
    cfg = config(tmp_path, permission_timeout=0.5, permission_rules=rules)
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    target = tmp_path / "a.txt"
    plain = await rpc(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("p3", f"permission {target}", workingDirectory=str(tmp_path)),
    )
    record = plain["result"]["permissions"][0]
    assert record["outcome"] == "reject_once" and record["decision"] == "reject"
    assert "streamless" in record["reason"]
    events = await collect(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("p3", f"permission {target}", workingDirectory=str(tmp_path)),
    )
    record = events[-1]["result"]["permissions"][0]
    assert record["outcome"] == "reject_once" and "no answer" in record["reason"]
    assert not target.exists()
    bad = await rpc(
        http,
        bp.rpc_url,
        "session.permission",
        {"sessionId": "p3", "requestId": "perm-x", "optionId": "once"},
    )
    assert bad["error"]["code"] == -32602
    bad = await rpc(http, bp.rpc_url, "session.permission", {"sessionId": "p3", "requestId": 5})
    assert bad["error"]["code"] == -32602 and "requestId" in bad["error"]["message"]


async def test_cancel_mid_turn_then_next_turn_works(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    events: list[dict[str, Any]] = []
    async for event in sse_stream(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("c1", "slow", workingDirectory=str(tmp_path)),
    ):
        events.append(event)
        if event.get("params", {}).get("delta") == "working":
            cancel = await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "c1"})
            assert cancel["result"] == {"accepted": True, "cancelled": True}
    result = events[-1]["result"]
    assert result["success"] is False and result["cancelled"] is True
    assert result["stopReason"] == "cancelled"
    after = await rpc(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("c1", "next", workingDirectory=str(tmp_path)),
    )
    assert after["result"]["output"] == "agent says: next"


async def test_a_cancel_sent_again_leaves_the_wait_for_the_agents_answer(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A turn's cancel is sent again until its executor takes it (one can be lost in a
    third-party ``asyncio.wait_for``); the executor says it arrived, so its wait for the
    agent's answer to ``session/cancel`` (its prompt's ``stopReason: cancelled``) is not
    cut short. RESEND 0: a re-send would come at the next loop iteration."""
    monkeypatch.setattr(handles, "RESEND", 0)
    started: list[Any] = []

    async def start(**kwargs: Any) -> Any:
        started.append(await start_bridge(**kwargs))
        return started[-1]

    await test_cancel_mid_turn_then_next_turn_works(start, http, tmp_path)
    answered = [e for e in log_entries(started[0].logs) if e.get("msg") == "agent turn cancelled"]
    # the stopReason itself, not the repr of the whole answer cut at 80 characters
    assert len(answered) == 1 and answered[0]["stop_reason"] == "cancelled", answered


async def test_crash_is_reported_and_agent_restarts(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    wd = str(tmp_path)
    first = await rpc(
        http, bp.rpc_url, "session.start", agent_params("k1", "hi", workingDirectory=wd)
    )
    crashed = await rpc(
        http, bp.rpc_url, "session.message", agent_params("k1", "crash", workingDirectory=wd)
    )
    assert crashed["result"]["success"] is False
    assert "exited (exit status 3)" in crashed["result"]["error"]
    assert "crashing on purpose" in crashed["result"]["error"]  # stderr tail
    again = await rpc(
        http, bp.rpc_url, "session.message", agent_params("k1", "back", workingDirectory=wd)
    )
    # a restarted agent without session/resume or /load gets a new ACP session, and the
    # bridge's stored history of the session as context before the prompt
    result = again["result"]
    assert result["agentSessionId"] != first["result"]["agentSessionId"]
    assert result["sessionContinuity"] == "replayed"
    assert result["output"].startswith("agent says: back [context: [Context from the bridge")
    assert "\n1. hi\n2. crash\n" in result["output"]
    assert first["result"]["sessionContinuity"] == "new"


async def test_an_agent_exiting_while_its_child_holds_its_pipes_fails_the_turn_at_once(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The agent exits, a ``sleep`` it started keeps its stdout and stderr: the turn
    fails with how it exited (not at the prompt timeout), and the next one runs."""
    bp = await start_bridge(config=config(tmp_path, prompt_timeout=20), tmp=tmp_path)
    wd = str(tmp_path)
    loop = asyncio.get_running_loop()
    started = loop.time()
    crashed = await rpc(
        http, bp.rpc_url, "session.start", agent_params("o1", "orphan 60", workingDirectory=wd)
    )
    assert crashed["result"]["success"] is False
    assert "exited (exit status 6)" in crashed["result"]["error"]
    assert loop.time() - started < 15
    again = await rpc(
        http, bp.rpc_url, "session.message", agent_params("o1", "back", workingDirectory=wd)
    )
    assert again["result"]["output"].startswith("agent says: back")


async def test_fs_requests_are_confined(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "proj").mkdir(parents=True)
    (root / "proj" / "in.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("secret")
    cfg = config(tmp_path)
    cfg["allowed_roots"] = [str(root)]
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    wd = str(root / "proj")

    async def say(prompt: str, workdir: str = wd) -> str:
        out = await rpc(
            http,
            bp.rpc_url,
            "session.message",
            agent_params("f1", prompt, workingDirectory=workdir),
        )
        return str(out["result"].get("output"))

    assert await say(f"read {root / 'proj' / 'in.txt'}") == "content: inside"
    assert await say(f"read {root / 'proj' / 'missing.txt'}") == "read error -32002"
    assert await say(f"read {tmp_path / 'secret.txt'}") == "read error -32602"
    assert await say(f"read {root / 'proj' / '..' / '..' / 'secret.txt'}") == "read error -32602"
    assert await say(f"write {root / 'proj' / 'sub' / 'new.txt'} hello") == "written"
    assert (root / "proj" / "sub" / "new.txt").read_text() == "hello"
    # a session directory outside the allowed roots gets no file access at all
    assert await say(f"read {tmp_path / 'secret.txt'}", str(tmp_path)) == "read error -32602"


async def test_big_lines_and_terminal(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    wd = str(tmp_path)
    big = await rpc(
        http, bp.rpc_url, "session.start", agent_params("b1", "big", workingDirectory=wd)
    )
    assert len(big["result"]["output"]) == 200 * 1024
    off = await rpc(
        http,
        bp.rpc_url,
        "session.message",
        agent_params("b1", "terminal echo hi", workingDirectory=wd),
    )
    assert off["result"]["output"].startswith("terminal error: method not supported")

    cfg = config(tmp_path, terminal_enabled=True)
    bp2 = await start_bridge(config=cfg, tmp=tmp_path)
    on = await rpc(
        http,
        bp2.rpc_url,
        "session.start",
        agent_params("b2", "terminal echo hi there", workingDirectory=wd),
    )
    assert on["result"]["output"] == "terminal output: hi there"


async def test_terminal_commands_get_the_agents_clean_environment(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A terminal the agent asks for runs with the agent's environment (launch.py),
    not the bridge's: the bridge's token and other variables never reach it."""
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_TEST_BRIDGE_ONLY="bridge-only-value")
    cfg = config(tmp_path, terminal_enabled=True)
    bp = await start_bridge(config=cfg, tmp=tmp_path, env=env)
    out = await rpc(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("t1", "terminal env", workingDirectory=str(tmp_path)),
    )
    output = out["result"]["output"]
    assert output.startswith("terminal output:") and "PATH=" in output
    # not even redacted: the variable is not there (the command could send it anywhere)
    assert "ACP_AUTH_TOKEN" not in output and TOKEN not in output
    assert "bridge-only-value" not in output


async def test_cancel_while_a_permission_is_pending(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    target = tmp_path / "never.txt"
    wd = str(tmp_path)
    events: list[dict[str, Any]] = []
    request_id = ""
    async for event in sse_stream(
        http,
        bp.rpc_url,
        "session.start",
        agent_params("pc", f"permission {target}", workingDirectory=wd),
    ):
        events.append(event)
        params = event.get("params", {})
        if params.get("type") == "permission" and params.get("pending"):
            request_id = params["requestId"]
            await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "pc"})
    assert request_id
    assert events[-1]["result"]["cancelled"] is True
    assert not target.exists()
    late = await rpc(
        http,
        bp.rpc_url,
        "session.permission",
        {"sessionId": "pc", "requestId": request_id, "optionId": "once"},
    )
    assert late["error"]["code"] == -32602
    after = await rpc(
        http, bp.rpc_url, "session.message", agent_params("pc", "ok", workingDirectory=wd)
    )
    assert after["result"]["output"] == "agent says: ok"


async def test_acp_stdio_transport_asks_and_gets_the_answer_on_stdin(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path)))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "acp-stdio",
        "--config",
        str(path),
        env=base_env(),
        cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    target = tmp_path / "stdio.txt"

    def send(body: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps({"jsonrpc": "2.0", **body}) + b"\n")

    try:
        send(
            {
                "id": 1,
                "method": "session.start",
                "params": agent_params(
                    "st", f"permission {target}", workingDirectory=str(tmp_path)
                ),
            }
        )
        while True:
            msg = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
            params = msg.get("params", {})
            if params.get("type") == "permission" and params.get("pending"):
                send(
                    {
                        "id": 2,
                        "method": "session.permission",
                        "params": {
                            "sessionId": "st",
                            "requestId": params["requestId"],
                            "optionId": "once",
                        },
                    }
                )
            if msg.get("id") == 1:
                break
        assert "permission granted (once)" in msg["result"]["output"]
        assert target.exists()
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 20)


async def test_restarted_agent_resumes_the_session_with_session_load(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    cfg = config(tmp_path)
    cfg["providers"] = [agent_provider(env=["FAKE_AGENT_LOAD_SESSION=1"])]
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    wd = str(tmp_path)
    first = await rpc(
        http, bp.rpc_url, "session.start", agent_params("l1", "hi", workingDirectory=wd)
    )
    crashed = await rpc(
        http, bp.rpc_url, "session.message", agent_params("l1", "crash", workingDirectory=wd)
    )
    assert crashed["result"]["success"] is False
    again = await rpc(
        http, bp.rpc_url, "session.message", agent_params("l1", "back", workingDirectory=wd)
    )
    assert again["result"]["output"] == "agent says: back"
    assert again["result"]["agentSessionId"] == first["result"]["agentSessionId"]
