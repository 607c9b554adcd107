"""Failures show in metrics and logs (issue 15 item 7): turn outcomes by provider and
mode, stdio agent failures as upstream errors, failed turns logged with their reason
at warning, and every rejected request counted and logged."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.conftest import (
    AUTH,
    TOKEN,
    FakeUpstream,
    StartBridge,
    closed_port,
    providers_config,
    rpc,
    session_params,
    wait_until,
)
from tests.integration.agent_helpers import agent_params, agent_provider


async def metrics(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as resp:
        return await resp.text()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series; 0 when absent. Labels must match exactly."""
    for line in text.splitlines():
        m = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == labels:
            return float(m.group(3))
    return 0.0


def entries(logs: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in logs if x.startswith("{")]


async def test_turn_outcomes_by_provider_and_mode(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    config = providers_config(
        {"id": "codex", "endpoint": fake_upstream.url}, {"id": "gemini", "endpoint": down}
    )
    bp = await start_bridge(config=config, tmp=tmp_path)
    ok = await rpc(http, bp.rpc_url, "session.start", session_params("o1", "hi"))
    assert ok["result"]["success"] is True
    bad_params = session_params("o2", "hi")
    bad_params["routing"]["explicitProviderId"] = "gemini"
    bad = await rpc(http, bp.rpc_url, "session.start", bad_params)
    assert bad["result"]["success"] is False
    slow = asyncio.create_task(
        rpc(http, bp.rpc_url, "session.start", session_params("o3", "slow:5000 x"))
    )
    await wait_until(lambda: "o3" in fake_upstream.state.active)
    await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "o3"})
    assert (await slow)["result"]["cancelled"] is True

    text = await metrics(http, bp.url)
    req = "xwm_requests_total"
    assert sample(text, req, method="session.start", transport="http", outcome="ok") == 1
    assert sample(text, req, method="session.start", transport="http", outcome="failed") == 1
    assert sample(text, req, method="session.start", transport="http", outcome="cancelled") == 1
    turns = "xwm_turn_duration_seconds_count"
    common = {"target": "single-agent", "mode": "single-agent"}
    assert sample(text, turns, **common, provider="codex", outcome="success") == 1
    assert sample(text, turns, **common, provider="gemini", outcome="failed") == 1
    assert sample(text, turns, **common, provider="codex", outcome="cancelled") == 1
    # process metrics, and no _created series
    assert sample(text, "process_cpu_seconds_total") > 0
    assert "_created" not in text

    lines = entries(bp.logs)
    failed = [e for e in lines if e["msg"] == "turn finished" and e.get("success") is False]
    by_session = {e["session_id"]: e for e in failed}
    assert by_session["o2"]["level"] == "warning"
    assert "Cannot connect" in by_session["o2"]["error"] or "connect" in by_session["o2"]["error"]
    assert by_session["o2"]["outcome"] == "failed"
    assert by_session["o3"]["level"] == "info" and by_session["o3"]["outcome"] == "cancelled"
    done = next(e for e in lines if e["msg"] == "turn finished" and e["session_id"] == "o1")
    assert done["level"] == "info" and done["outcome"] == "success"
    # the failed call itself: session, provider and the metric's kind, at warning
    call = next(e for e in lines if e["msg"] == "upstream call failed")
    assert call["level"] == "warning"
    assert (call["session_id"], call["provider"], call["kind"]) == ("o2", "gemini", "transport")
    assert "connect" in call["error"]


async def test_stdio_agent_failures_are_upstream_errors(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = providers_config(
        agent_provider("ghost", command=["/nonexistent/agent-xyz", "acp"]),
        allowed_roots=[str(tmp_path)],
    )
    bp = await start_bridge(config=config, tmp=tmp_path)
    reply = await rpc(http, bp.rpc_url, "session.start", agent_params("g1", "hi", "ghost"))
    assert reply["result"]["success"] is False
    text = await metrics(http, bp.url)
    assert sample(text, "xwm_upstream_errors_total", provider="ghost", kind="transport") == 1
    count = "xwm_turn_duration_seconds_count"
    labels = {"target": "single-agent", "mode": "single-agent", "provider": "ghost"}
    assert sample(text, count, **labels, outcome="failed") == 1
    call = next(e for e in entries(bp.logs) if e["msg"] == "agent call failed")
    assert call["level"] == "warning"
    assert (call["session_id"], call["provider"], call["kind"]) == ("g1", "ghost", "transport")
    assert "agent-xyz" in call["error"]


async def test_an_agent_crash_mid_turn_is_one_warning_and_a_metric(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    config = providers_config(agent_provider("fake"), allowed_roots=[str(tmp_path)])
    bp = await start_bridge(config=config, tmp=tmp_path)
    params = agent_params("c1", "crash", workingDirectory=str(tmp_path))
    reply = await rpc(http, bp.rpc_url, "session.start", params)
    assert reply["result"]["success"] is False
    text = await metrics(http, bp.url)
    assert sample(text, "xwm_upstream_errors_total", provider="fake", kind="transport") == 1
    failed = [e for e in entries(bp.logs) if e["msg"] == "agent call failed"]
    assert len(failed) == 1, failed
    call = failed[0]
    assert call["level"] == "warning"
    assert (call["session_id"], call["provider"], call["kind"]) == ("c1", "fake", "transport")
    assert call["error"]
    finished = next(e for e in entries(bp.logs) if e["msg"] == "turn finished")
    assert finished["level"] == "warning" and finished["session_id"] == "c1"
    assert finished["provider"] == "fake" and finished["duration_ms"] >= 0


async def test_rejected_requests_are_counted_and_logged(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    config = providers_config(
        {"id": "codex", "endpoint": fake_upstream.url}, limits={"max_body_bytes": 1024}
    )
    bp = await start_bridge(config=config, tmp=tmp_path)
    caps = b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}'
    cases = [
        ({}, caps, 401, "missing_token"),
        ({"Authorization": "Bearer nope"}, caps, 401, "invalid_token"),
        ({**AUTH, "Origin": "https://evil.example.com"}, caps, 403, "origin"),
        (AUTH, b"x" * 2048, 413, "body_too_large"),
        (AUTH, b"{not json", 400, "parse_error"),
    ]
    for headers, body, status, _ in cases:
        async with http.post(bp.rpc_url, data=body, headers=headers) as resp:
            assert resp.status == status
    async with http.ws_connect(bp.ws_url, headers=AUTH) as ws:
        await ws.send_str("{nope")
        assert (await ws.receive_json())["error"]["code"] == -32700
    text = await metrics(http, bp.url)
    for _, _, _, reason in cases:
        assert sample(text, "xwm_rejected_requests_total", transport="http", reason=reason) == 1
    assert sample(text, "xwm_rejected_requests_total", transport="ws", reason="parse_error") == 1
    rejected = [e for e in entries(bp.logs) if e["msg"] == "request rejected"]
    assert [(e["transport"], e["reason"]) for e in rejected] == [
        *(("http", reason) for _, _, _, reason in cases),
        ("ws", "parse_error"),
    ]
    assert [e.get("status") for e in rejected[:5]] == [401, 401, 403, 413, 400]
    assert all(TOKEN not in orjson.dumps(e).decode() for e in rejected)


async def test_a_timed_out_turn_names_the_deadline(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # takes the request, never answers

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    provider = {"id": "codex", "endpoint": f"http://127.0.0.1:{port}", "total_timeout": 0.5}
    try:
        bp = await start_bridge(config=providers_config(provider), tmp=tmp_path)
        reply = await rpc(http, bp.rpc_url, "session.start", session_params("t1", "hi"))
    finally:
        server.close()
        for writer in accepted:
            writer.close()
    error = reply["result"]["error"]
    assert "timed out" in error and "0.5s" in error and "total_timeout" in error, error
    call = next(e for e in entries(bp.logs) if e["msg"] == "upstream call failed")
    assert call["kind"] == "timeout" and call["session_id"] == "t1"
