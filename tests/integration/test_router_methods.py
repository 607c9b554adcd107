"""The router methods end to end (HTTP, WebSocket, stdio) and auto routing in
the turn pipeline: classifier over the fake LLM, memory recording, no blocking."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from internal.peers.fake_llm import STATE_KEY, create_app
from tests.conftest import (
    AUTH,
    ROOT,
    FakeUpstream,
    ServeApp,
    StartBridge,
    provider_env,
    rpc,
    wait_until,
)

ROUTING_PARAMS = {
    "taskPrompt": "create a powerpoint deck for this launch",
    "workingDirectory": "/srv/workspace",
    "routing": {
        "routingMode": "auto",
        "preferredGatewayProviderId": "local",
        "allowSkillInstall": False,
        "availableSkills": [
            {"id": "pptx", "label": "PPTX", "description": "slides", "installed": True},
            {"id": "docx", "label": "DOCX", "description": "docs", "installed": True},
        ],
    },
}
ROUTING_RESULT = {
    "ok": True,
    "resolvedExecutionTarget": "single-agent",
    "resolvedProviderId": "codex",
    "resolvedGatewayProviderId": "",
    "resolvedModel": "",
    "resolvedSkills": ["PPTX"],
    "skillResolutionSource": "local_match",
    "needsSkillInstall": False,
    "unavailable": False,
}
DISPATCH_PARAMS = {
    "providers": [{"id": "qwen", "name": "Qwen", "capabilities": ["chat"]}],
}
DISPATCH_RESULT = {
    "metadata": {},
    "providerId": "qwen",
    "provider": {"id": "qwen", "name": "Qwen", "defaultArgs": None, "capabilities": ["chat"]},
}
EMPTY_ROUTING = {
    "ok": True,
    "resolvedExecutionTarget": "",
    "resolvedProviderId": "",
    "resolvedGatewayProviderId": "",
    "resolvedModel": "",
    "resolvedSkills": None,
    "skillResolutionSource": "",
    "needsSkillInstall": False,
    "unavailable": False,
}


def bridge_env(tmp: Path, upstream: str, **extra: str) -> dict[str, str]:
    env = provider_env(upstream, HOME=str(tmp / "home"), **extra)
    for var in ("LLM_API_KEY", "LLM_BASE_URL"):
        if var not in extra:
            env.pop(var, None)
    return env


def write_config(tmp: Path, **router: Any) -> Path:
    path = tmp / "router.yaml"
    doc = {
        "router": {"memory_project_roots": [str(tmp / "projects")], **router},
        "mounts": {"codex_home": str(tmp / "codex-home")},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def check_mounts(result: dict[str, Any]) -> None:
    assert [t["targetId"] for t in result["mountTargets"]] == [
        "aris", "codex", "claude", "gemini", "opencode", "openclaw",
    ]  # fmt: skip
    assert result["arisCompatStatus"] == "missing"


async def test_three_methods_over_http_and_ws(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path)
    bridge = await start_bridge("--config", str(cfg), env=bridge_env(tmp_path, fake_upstream.url))
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", ROUTING_PARAMS)
    assert got["result"] == ROUTING_RESULT
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", {"taskPrompt": "x"})
    assert got["result"] == EMPTY_ROUTING
    got = await rpc(http, bridge.rpc_url, "xworkmate.dispatch.resolve", DISPATCH_PARAMS)
    assert got["result"] == DISPATCH_RESULT
    got = await rpc(http, bridge.rpc_url, "xworkmate.mounts.reconcile", {})
    check_mounts(got["result"])

    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        calls = [
            ("xworkmate.routing.resolve", ROUTING_PARAMS),
            ("xworkmate.dispatch.resolve", DISPATCH_PARAMS),
            ("xworkmate.mounts.reconcile", {"config": {"autoSync": False}}),
        ]
        for i, (method, params) in enumerate(calls):
            await ws.send_str(
                orjson.dumps(
                    {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
                ).decode()
            )
        answers: dict[int, Any] = {}
        while len(answers) < 3:
            msg = orjson.loads((await ws.receive(timeout=10)).data)
            answers[msg["id"]] = msg["result"]
    assert answers[0] == ROUTING_RESULT
    assert answers[1] == DISPATCH_RESULT
    check_mounts(answers[2])
    # a preflight never records memory
    assert not (tmp_path / "home" / "self-improving").exists()


async def test_three_methods_over_stdio(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    cfg = write_config(tmp_path)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "acp-stdio", "--config", str(cfg),
        env=bridge_env(tmp_path, fake_upstream.url), cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for i, (method, params) in enumerate(
            [
                ("xworkmate.routing.resolve", ROUTING_PARAMS),
                ("xworkmate.dispatch.resolve", DISPATCH_PARAMS),
                ("xworkmate.mounts.reconcile", {}),
            ]
        ):
            body = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
            proc.stdin.write(orjson.dumps(body) + b"\n")
        await proc.stdin.drain()
        answers = {}
        while len(answers) < 3:
            msg = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 15))
            answers[msg["id"]] = msg["result"]
        assert answers[0] == ROUTING_RESULT
        assert answers[1] == DISPATCH_RESULT
        check_mounts(answers[2])
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


WRONG_TYPES: list[tuple[str, dict[str, Any]]] = [
    ("xworkmate.routing.resolve", {"routing": "auto"}),
    ("xworkmate.routing.resolve", {"routing": [1]}),
    ("xworkmate.routing.resolve", {"routing": {"routingMode": 5}, "taskPrompt": {"a": 1}}),
    ("xworkmate.routing.resolve", {"routing": {"routingMode": "explicit",
                                               "explicitExecutionTarget": ["x"]}}),
    ("xworkmate.routing.resolve", {"routing": {"preferredGatewayProviderId": 1,
                                               "explicitProviderId": True}}),
    ("xworkmate.routing.resolve", {"routing": {"explicitModel": [], "explicitSkills": "pdf"}}),
    ("xworkmate.routing.resolve", {"routing": {"allowSkillInstall": "maybe",
                                               "installApproval": "x"}}),
    ("xworkmate.routing.resolve", {"routing": {"installApproval": {"requestId": 1,
                                               "approvedSkillKeys": "a"}}}),
    ("xworkmate.routing.resolve", {"routing": {"availableSkills": "pptx"}}),
    ("xworkmate.routing.resolve", {"routing": {"availableSkills": [1, {"id": []}]},
                                   "workingDirectory": 7, "aiGatewayBaseUrl": [],
                                   "aiGatewayApiKey": {}}),
    ("xworkmate.dispatch.resolve", {"providers": "x", "preferredProviderId": {},
                                    "requiredCapabilities": 3}),
    ("xworkmate.dispatch.resolve", {"providers": [{"id": 1, "defaultArgs": "a",
                                                   "capabilities": {}}], "nodeState": [],
                                    "nodeInfo": "n"}),
    ("xworkmate.dispatch.resolve", {"nodeState": {"bridgeEnabled": [], "runtimeMode": 1,
                                                  "selectedAgentId": {}}}),
    ("xworkmate.mounts.reconcile", {"config": [], "aris": 1}),
    ("xworkmate.mounts.reconcile", {"config": {"managedMcpServers": {"id": "x"},
                                               "autoSync": {}}, "codexHome": 1,
                                    "opencodeHome": [], "openclawHome": {},
                                    "aiGatewayUrl": 2, "configuredCodexCliPath": 3}),
    ("xworkmate.mounts.reconcile", {"aris": {"skillCount": "many", "available": 2,
                                             "bundleVersion": [], "error": {}}}),
]  # fmt: skip


async def test_wrong_types_are_coerced_never_a_traceback(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path)
    bridge = await start_bridge("--config", str(cfg), env=bridge_env(tmp_path, fake_upstream.url))
    for method, params in WRONG_TYPES:
        got = await rpc(http, bridge.rpc_url, method, params)
        assert "result" in got, (method, params, got)
    # params that are not an object at all are an invalid request, not a crash
    body = {"jsonrpc": "2.0", "id": 9, "method": "xworkmate.routing.resolve", "params": [1]}
    async with http.post(bridge.rpc_url, data=orjson.dumps(body), headers=AUTH) as resp:
        answer = orjson.loads(await resp.read())
    assert answer["error"]["code"] in (-32600, -32602, -32700)


# --- auto routing inside the turn pipeline -------------------------------------------------


async def start_llm(serve_app: ServeApp) -> tuple[str, Any]:
    app = create_app()
    return await serve_app(app), app[STATE_KEY]


STAMP = "[Mon 2026-11-30 01:52 UTC]"


def turn(sid: str, prompt: str, wd: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "sessionId": sid,
        "threadId": sid,
        "taskPrompt": prompt,
        "workingDirectory": wd,
        "routing": {"routingMode": "auto"},
        **extra,
    }


async def test_classifier_routes_turn_and_memory_is_recorded(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    server_llm, server_state = await start_llm(serve_app)
    client_llm, client_state = await start_llm(serve_app)
    cfg = write_config(tmp_path)
    env = bridge_env(
        tmp_path, fake_upstream.url, LLM_BASE_URL=server_llm, LLM_API_KEY="server-key-123"
    )
    bridge = await start_bridge("--config", str(cfg), env=env)
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    # the client names its own URL but no key: the server key must not go there
    params = turn("s1", "hello single-agent please", str(wd), aiGatewayBaseUrl=client_llm)
    got = await rpc(http, bridge.rpc_url, "session.start", params)
    result = got["result"]
    assert result["success"] is True, result
    assert result["resolvedExecutionTarget"] == "single-agent"
    assert result["resolvedProviderId"] == "codex"
    assert client_state.requests == []
    assert [r["headers"]["Authorization"] for r in server_state.requests] == [
        "Bearer server-key-123"
    ]
    memory = (wd / ".xworkmate" / "memory.md").read_text()
    assert "preferred-route: single-agent\n" in memory and "provider: codex\n" in memory
    # the same prompt again: answered from the cache, and memory is now a source
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", params)
    assert len(server_state.requests) == 1
    assert got["result"]["memorySources"] == [
        {"path": str(wd / ".xworkmate" / "memory.md"), "scope": "project-local"}
    ]
    # the client's own key goes to the client's own URL
    with_key = turn("s2", "route gateway", aiGatewayBaseUrl=client_llm, aiGatewayApiKey="ck")
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", with_key)
    assert got["result"]["resolvedExecutionTarget"] == "gateway"
    assert [r["headers"]["Authorization"] for r in client_state.requests] == ["Bearer ck"]


async def test_memory_write_failure_keeps_the_successful_result(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path)
    bridge = await start_bridge("--config", str(cfg), env=bridge_env(tmp_path, fake_upstream.url))
    wd = tmp_path / "projects" / "app"
    wd.mkdir(parents=True)
    (wd / ".xworkmate").write_text("a file, so the memory directory cannot be created")
    got = await rpc(http, bridge.rpc_url, "session.start", turn("m1", "convert the docx", str(wd)))
    assert "error" not in got
    assert got["result"]["success"] is True
    assert got["result"]["output"] == "echo: convert the docx"


async def test_slow_classifier_does_not_block_other_threads(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    llm, state = await start_llm(serve_app)
    cfg = write_config(tmp_path, classifier_timeout=2.5)
    env = bridge_env(tmp_path, fake_upstream.url, LLM_BASE_URL=llm, LLM_API_KEY="k-123456")
    bridge = await start_bridge("--config", str(cfg), env=env)
    slow = asyncio.create_task(
        # the fake LLM drops the leading timestamp and honours ``slow:``; the fake
        # upstream does not, so only the classifier is slow
        rpc(http, bridge.rpc_url, "session.start", turn("slow", f"{STAMP} slow:10000 hmm"))
    )
    await wait_until(lambda: len(state.requests) == 1)  # the classifier's call is in flight
    started = time.monotonic()
    fast = await rpc(http, bridge.rpc_url, "session.start", turn("fast", "convert the docx"))
    assert fast["result"]["success"] is True
    assert time.monotonic() - started < 2.0
    assert not slow.done()
    # the classifier deadline (2.5 s) ends the wait: no answer → fallback single-agent
    got = await asyncio.wait_for(slow, 10)
    assert got["result"]["resolvedExecutionTarget"] == "single-agent"
    assert len(state.requests) == 1


async def test_unknown_explicit_target_is_unavailable_turn(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bridge = await start_bridge(env=bridge_env(tmp_path, fake_upstream.url))
    params = {
        "sessionId": "u1",
        "taskPrompt": "hi",
        "routing": {"routingMode": "explicit", "explicitExecutionTarget": "Gatewey"},
    }
    got = await rpc(http, bridge.rpc_url, "session.start", params)
    result = got["result"]
    assert result["success"] is False and result["unavailable"] is True
    assert result["unavailableCode"] == "UNKNOWN_EXECUTION_TARGET"
    assert "Gatewey" in result["error"]
    assert fake_upstream.state.requests == []


@pytest.mark.parametrize("target", ["SingleAgent", "single_agent"])
async def test_explicit_targets_are_case_insensitive_in_turns(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    target: str,
) -> None:
    bridge = await start_bridge(env=bridge_env(tmp_path, fake_upstream.url))
    params = {
        "sessionId": "c1",
        "taskPrompt": "hi",
        "routing": {"routingMode": "explicit", "explicitExecutionTarget": target},
    }
    got = await rpc(http, bridge.rpc_url, "session.start", params)
    assert got["result"]["success"] is True
    assert got["result"]["resolvedExecutionTarget"] == "single-agent"


async def test_project_memory_defaults_to_allowed_roots(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """Issue 15 item 4: without router.memory_project_roots, project-local memory is
    used under allowed_roots (existing clients keep routing memory), and only there."""
    inside = tmp_path / "projects" / "app"
    outside = tmp_path / "elsewhere" / "app"
    for wd in (inside, outside):
        (wd / ".xworkmate").mkdir(parents=True)
        (wd / ".xworkmate" / "memory.md").write_text("provider: gemini\n")
    path = tmp_path / "roots.yaml"
    path.write_text(yaml.safe_dump({"allowed_roots": [str(tmp_path / "projects")]}))
    bridge = await start_bridge("--config", str(path), env=bridge_env(tmp_path, fake_upstream.url))
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", turn("p", "hi", str(inside)))
    assert got["result"]["memorySources"] == [
        {"path": str(inside / ".xworkmate" / "memory.md"), "scope": "project-local"}
    ]
    assert got["result"]["resolvedProviderId"] == "gemini"
    got = await rpc(
        http, bridge.rpc_url, "xworkmate.routing.resolve", turn("q", "hi", str(outside))
    )
    assert not got["result"].get("memorySources")  # outside the roots: confined


@pytest.mark.parametrize(
    ("allowed", "reaches"),
    [(None, True), (["127.0.0.1"], True), (["10.9.9.9"], False), (["*"], True)],
    ids=["default-loopback", "listed", "not-listed", "any"],
)
async def test_a_client_classifier_url_must_be_an_allowed_host(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    allowed: list[str] | None,
    reaches: bool,
) -> None:
    """issue 16 item 10: a client key let the client make the daemon dial any URL."""
    client_llm, client_state = await start_llm(serve_app)
    router = {} if allowed is None else {"classifier_allowed_hosts": allowed}
    cfg = write_config(tmp_path, **router)
    bridge = await start_bridge("--config", str(cfg), env=bridge_env(tmp_path, fake_upstream.url))
    params = turn("c1", "route gateway", aiGatewayBaseUrl=client_llm, aiGatewayApiKey="ck")
    got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", params)
    assert "result" in got
    assert bool(client_state.requests) is reaches


async def test_a_client_classifier_url_off_loopback_is_never_dialed(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    cfg = write_config(tmp_path, classifier_timeout=20)
    bridge = await start_bridge("--config", str(cfg), env=bridge_env(tmp_path, fake_upstream.url))
    far = "http://198.51.100.7:9/v1"  # TEST-NET-2: a dial would hang until the deadline
    params = turn("c2", "route it", aiGatewayBaseUrl=far, aiGatewayApiKey="ck")
    async with asyncio.timeout(5):
        got = await rpc(http, bridge.rpc_url, "xworkmate.routing.resolve", params)
    assert "result" in got
    assert bridge.bridge.router.classifier.calls == 0
