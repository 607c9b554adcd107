"""Operations: health, metrics, structured logs with redaction, graceful shutdown, doctor."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    ROOT,
    TOKEN,
    FakeUpstream,
    ServeApp,
    StartBridge,
    base_env,
    closed_port,
    provider_env,
    rpc,
    scripted_app,
    session_params,
    sse,
    wait_queue_depth,
    wait_until,
)
from tests.processes import processes_with


async def test_livez_readyz_and_metrics_unauthenticated(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    async with http.get(f"{bridge.url}/livez") as resp:
        assert resp.status == 200 and await resp.json() == {"status": "ok"}
    async with http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 200 and await resp.json() == {"status": "ready"}

    await rpc(http, bridge.rpc_url, "session.start", session_params("m1", "hi"))
    await rpc(http, bridge.rpc_url, "no.such.method")
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str('{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}')
        await ws.receive()
        async with http.get(f"{bridge.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = await resp.text()
    assert 'xwm_requests_total{method="session.start",outcome="ok",transport="http"} 1.0' in text
    # unknown method names collapse into one label value: the label set stays bounded
    assert 'xwm_requests_total{method="other",outcome="error",transport="http"} 1.0' in text
    assert (
        'xwm_turn_duration_seconds_count{mode="single-agent",outcome="success",provider="codex",'
        'target="single-agent"} 1.0'
    ) in text
    assert "xwm_websocket_connections 1.0" in text
    assert "xwm_active_turns 0.0" in text
    assert "xwm_sessions_alive 1.0" in text
    assert 'xwm_gateway_runtimes{state="connected"} 0.0' in text
    assert 'xwm_bytes_received_total{transport="http"}' in text


async def test_turn_metric_provider_label_is_bounded(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """A turn that routes to no provider (multi-agent here) is labelled with the routed
    provider (none), not with whatever ``provider`` string the client sent: one new
    histogram series per client-chosen value grew /metrics without bound."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    route = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}
    for i in range(3):
        params = {"sessionId": f"ma{i}", "taskPrompt": "hi", "provider": f"chosen-{i}"}
        await rpc(http, bridge.rpc_url, "session.start", {**params, "routing": route})
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    assert "chosen-" not in text
    assert (
        'xwm_turn_duration_seconds_count{mode="multi-agent",outcome="failed",provider="",'
        'target="multi-agent"} 3.0'
    ) in text


async def test_readyz_requires_providers_when_configured(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    config = {
        "ready_requires_providers": True,
        "providers": [
            {"id": "codex", "endpoint": fake_upstream.url},
            {"id": "gemini", "endpoint": down},
        ],
    }
    bridge = await start_bridge(config=config, tmp=tmp_path)
    async with http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["status"] == "unready"
    assert set(body["providers"]) == {"gemini"}


async def test_upstream_error_metric(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    env = provider_env(f"http://127.0.0.1:{closed_port()}")
    bridge = await start_bridge(env=env)
    reply = await rpc(http, bridge.rpc_url, "session.start", session_params("m2", "hi"))
    assert reply["result"]["success"] is False
    async with http.get(f"{bridge.url}/metrics") as resp:
        text = await resp.text()
    assert 'xwm_upstream_errors_total{kind="transport",provider="codex"} 1.0' in text


async def test_json_logs_audit_ids_and_no_secret_anywhere(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    service_token = "svc-SECRET-7f3a9c"
    prompt_marker = "PROMPT-MARKER-do-not-log"

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        # a hostile upstream echoes our credential in its error: it must not reach a log line
        message = f"denied for Bearer {service_token}"
        return {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -1, "message": message}}

    upstream = await serve_app(scripted_app(reply, []))
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        INTERNAL_SERVICE_TOKEN=service_token,
        XWM_PROVIDER_CODEX_URL=upstream,
        XWM_LOG_LEVEL="debug",
    )
    bridge = await start_bridge(env=env)
    await sse(http, bridge.rpc_url, "session.start", session_params("log-1", prompt_marker))
    await rpc(http, bridge.rpc_url, "acp.capabilities")
    async with http.post(
        bridge.rpc_url, data=b"{}", headers={"Authorization": "Bearer wrong-" + TOKEN}
    ):
        pass
    assert await bridge.stop() == 0

    entries = [orjson.loads(line) for line in bridge.logs]  # every line is one JSON object
    whole = "\n".join(bridge.logs)
    for secret in (TOKEN, service_token):
        assert secret not in whole
    assert prompt_marker not in whole
    audits = [e for e in entries if e.get("audit")]
    assert {a["method"] for a in audits} >= {"session.start", "acp.capabilities"}
    turn_audit = next(a for a in audits if a["method"] == "session.start")
    assert turn_audit["session_id"] == "log-1" and turn_audit["target"] == "single-agent"
    assert turn_audit["provider"] == "codex" and turn_audit["success"] is False
    assert turn_audit["notifications"] == 2  # started + completed-error
    allowed = {
        "ts",
        "level",
        "logger",
        "msg",
        "audit",
        "transport",
        "method",
        "outcome",
        "duration_ms",
        "notifications",
        "code",
        "session_id",
        "target",
        "provider",
        "success",
        "request_id",
    }
    assert set().union(*(a.keys() for a in audits)) <= allowed
    # every line of the turn carries its request id and turn id
    failed = next(e for e in entries if e["msg"] == "upstream call failed")
    finished = next(e for e in entries if e["msg"] == "turn finished")
    assert failed["request_id"] == finished["request_id"] == turn_audit["request_id"]
    assert failed["turn_id"] == finished["turn_id"] and failed["turn_id"].startswith("turn-")
    assert "[REDACTED]" in failed["error"]


async def test_sigterm_drains_then_cancels_and_exits_zero(
    start_bridge_process: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    config = {
        "limits": {"shutdown_grace": 1.5},
        "providers": [{"id": "codex", "endpoint": fake_upstream.url}],
    }
    env = base_env(ACP_AUTH_TOKEN=TOKEN)
    bridge = await start_bridge_process(config=config, tmp=tmp_path, env=env)

    quick = asyncio.create_task(
        sse(http, bridge.rpc_url, "session.start", session_params("q", "slow:500 a"))
    )
    slow_sse = asyncio.create_task(
        sse(http, bridge.rpc_url, "session.start", session_params("s", "slow:20000 b"))
    )
    await wait_until(lambda: "s" in fake_upstream.state.active)  # before the queued one
    queued = asyncio.create_task(
        rpc(http, bridge.rpc_url, "session.message", session_params("s", "never runs"))
    )
    await wait_queue_depth(http, bridge.url, 1)
    ws = await http.ws_connect(bridge.ws_url, headers=AUTH)
    await ws.send_bytes(
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": "w",
                "method": "session.start",
                "params": session_params("w", "slow:20000 c"),
            }
        )
    )
    await wait_until(lambda: len(fake_upstream.state.active) == 3)

    bridge.proc.send_signal(signal.SIGTERM)
    quick_events = await asyncio.wait_for(quick, 10)
    assert quick_events[-1]["result"]["success"] is True, quick_events  # within the grace period
    slow_events = await asyncio.wait_for(slow_sse, 10)
    final = slow_events[-1]["result"]
    assert (
        final["success"] is False
        and final["cancelled"] is True
        and final["error"] == "turn cancelled"
    )
    queued_reply = await asyncio.wait_for(queued, 10)
    assert queued_reply["error"]["code"] == -32005
    ws_final: dict[str, Any] | None = None
    close_code = None
    while True:
        msg = await asyncio.wait_for(ws.receive(), 10)
        if msg.type == aiohttp.WSMsgType.TEXT:
            frame = orjson.loads(msg.data)
            if frame.get("id") == "w":
                ws_final = frame["result"]
        else:
            assert msg.type == aiohttp.WSMsgType.CLOSE, msg
            close_code = msg.data  # the code in the server's close frame
            break
    assert ws_final is not None and ws_final["cancelled"] is True
    assert close_code == 1001
    assert await asyncio.wait_for(bridge.proc.wait(), 15) == 0  # exits by itself after the drain
    assert {c["sessionId"] for c in fake_upstream.state.cancels} == {"s", "w"}


async def test_doctor_reports_and_masks(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    async def doctor(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "xwm_bridge",
            "doctor",
            "--json",
            env=env,
            cwd=str(ROOT),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, orjson.loads(out)

    good = provider_env(fake_upstream.url, INTERNAL_SERVICE_TOKEN="svc-doctor-secret")
    code, doc = await doctor(good)
    assert code == 0
    assert all(c["ok"] for c in doc["checks"] if not c.get("optional"))
    # nobody configured an OpenClaw gateway: not checked (tests/integration/test_doctor.py)
    assert not [c for c in doc["checks"] if c["check"] == "gateway"]
    assert doc["config"]["auth_token"] == "********"
    assert doc["config"]["internal_service_token"] == "********"
    assert "svc-doctor-secret" not in orjson.dumps(doc).decode()
    assert doc["sources"]["auth_token"] == "env:ACP_AUTH_TOKEN"
    assert doc["sources"]["providers[0].endpoint"] == "env:XWM_PROVIDER_CODEX_URL"
    # the upstream received the deploy probe with the bridge's credential
    probe = fake_upstream.state.requests[-1]
    assert probe["method"] == "acp.capabilities"

    bad = provider_env(f"http://127.0.0.1:{closed_port()}")
    code, doc = await doctor(bad)
    assert code == 1
    assert [c["ok"] for c in doc["checks"] if c["check"] == "provider"] == [False, False, False]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["term", "hup"])
async def test_sigterm_with_a_stubborn_agent_leaves_no_child(
    start_bridge_process: StartBridge,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    stop: signal.Signals,
) -> None:
    """An agent that ignores EOF and SIGTERM is mid-turn when the daemon is told to stop:
    the caller gets a cancelled result and the agent's whole process group is gone.
    SIGHUP (the terminal of a foreground bridge closed) killed the daemon outright and
    left the agent running."""
    from tests.integration.agent_helpers import agent_params, agent_provider, deltas, sse_stream

    marker = f"XWM_TEST_MARKER={tmp_path.name}"
    provider = agent_provider(env=[marker, "FAKE_AGENT_IGNORE_EOF=1"])
    config = {
        "providers": [provider],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 20, "stop_grace": 1},
        "limits": {"shutdown_grace": 1},
    }
    bridge = await start_bridge_process(config=config, tmp=tmp_path)
    events: list[dict[str, Any]] = []

    async def read_turn() -> None:
        params = agent_params("stubborn", "slow", workingDirectory=str(tmp_path))
        async for event in sse_stream(http, bridge.rpc_url, "session.start", params):
            events.append(event)

    turn = asyncio.create_task(read_turn())
    # the agent is inside its slow turn: it sent its one chunk and waits for a cancel
    await wait_until(lambda: deltas(events) == "working", within=20)
    assert processes_with(marker)
    bridge.proc.send_signal(stop)
    await asyncio.wait_for(turn, 20)
    result = events[-1]["result"]
    assert result["success"] is False and result.get("cancelled") is True
    assert await asyncio.wait_for(bridge.proc.wait(), 20) == 0
    await wait_until(lambda: not processes_with(marker), within=5)


async def test_second_signal_during_the_drain_forces_the_exit(
    start_bridge_process: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    """Issue 15 item 5: the first SIGTERM says in the log that a second one forces the
    exit; the second cancels the running turns at once instead of waiting the grace."""
    config = {
        "limits": {"shutdown_grace": 60},
        "providers": [{"id": "codex", "endpoint": fake_upstream.url}],
    }
    bridge = await start_bridge_process(config=config, tmp=tmp_path)
    slow = asyncio.create_task(
        sse(http, bridge.rpc_url, "session.start", session_params("s2", "slow:60000 x"))
    )
    await wait_until(lambda: "s2" in fake_upstream.state.active)
    bridge.proc.send_signal(signal.SIGTERM)

    def line(msg: str) -> dict[str, Any] | None:
        for text in bridge.logs:
            entry = orjson.loads(text) if text.startswith("{") else {}
            if entry.get("msg") == msg:
                return entry
        return None

    await wait_until(lambda: line("shutting down") is not None, within=10)
    first = line("shutting down")
    assert first is not None and first["signal"] == "SIGTERM"
    assert "again" in first["hint"] and first["grace_s"] == 60
    started = asyncio.get_running_loop().time()
    bridge.proc.send_signal(signal.SIGINT)
    code = await asyncio.wait_for(bridge.proc.wait(), 20)
    assert asyncio.get_running_loop().time() - started < 15  # not the 60 s grace
    assert code == 1
    forced = line("second signal: forcing the exit")
    assert forced is not None and forced["level"] == "warning" and forced["signal"] == "SIGINT"
    final = (await asyncio.wait_for(slow, 10))[-1]["result"]
    assert final["success"] is False and final["cancelled"] is True
    assert {c["sessionId"] for c in fake_upstream.state.cancels} == {"s2"}  # upstream told


async def test_serve_notifies_systemd_ready_and_stopping(
    start_bridge_process: StartBridge, tmp_path: Path
) -> None:
    """Issue 15 item 12: Type=notify readiness over $NOTIFY_SOCKET."""
    import socket

    path = str(tmp_path / "notify.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        bridge = await start_bridge_process(env=base_env(ACP_AUTH_TOKEN=TOKEN, NOTIFY_SOCKET=path))
        ready = (await asyncio.wait_for(loop.sock_recv(server, 4096), 10)).decode()
        lines = ready.split("\n")
        assert lines[0] == "READY=1" and f"MAINPID={bridge.proc.pid}" in lines
        assert f"STATUS=listening on 127.0.0.1:{bridge.port}" in lines
        bridge.proc.send_signal(signal.SIGTERM)
        stopping = await asyncio.wait_for(loop.sock_recv(server, 4096), 10)
        assert stopping.startswith(b"STOPPING=1")
        assert await asyncio.wait_for(bridge.proc.wait(), 30) == 0
    finally:
        server.close()


#: the daemon, with a SIGTERM sent to itself the moment its port is open (before
#: READY=1): what a supervisor or a test that waits for the port may do
_TERM_ON_LISTEN = """
import os, signal
from xwm_bridge.transport import serving
listen = serving.Server.listen
async def listen_then_term(self, *args, **kwargs):
    port = await listen(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return port
serving.Server.listen = listen_then_term
from xwm_bridge.cli import main
main(["serve", "--listen", "127.0.0.1:0"])
"""


async def test_a_sigterm_as_soon_as_the_port_is_open_drains_and_exits_0(
    tmp_path: Path,
) -> None:
    """The handlers were installed after READY=1: a SIGTERM right after the port
    opened met the default action (exit -15, no drain, no STOPPING=1)."""
    import socket

    path = str(tmp_path / "notify.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.setblocking(False)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _TERM_ON_LISTEN,
            env=base_env(ACP_AUTH_TOKEN=TOKEN, NOTIFY_SOCKET=path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()[-2000:]
        assert b'"msg":"stopped"' in err
        sent = []
        with contextlib.suppress(BlockingIOError):
            while True:
                sent.append(server.recv(4096))
        # READY=1 may come first (the signal is handled once listen() returns); the
        # last word is STOPPING=1
        assert sent and sent[-1].startswith(b"STOPPING=1"), sent
    finally:
        server.close()


SECRETS = {
    "client_tokens": "cli-tok-AAA1",
    "admin_tokens": "adm-tok-BBB2",
    "openclaw_token": "oc-tok-CCC3",
    "multi_agent.api_key": "ma-key-DDD4",
    "router.llm_api_key": "rt-key-EEE5",
    "toolbridge.llm_api_key": "tb-key-FFF6",
    "toolbridge.vault_token": "vault-GGG7",
    "redis password": "redis-pw-HHH8",
    "provider URL password": "url-pw-III9",
    "provider env": "env-val-JJJ0",
    "short provider env": "k1",
    "auth_header": "hdr-KKK1",
}


async def test_doctor_masks_every_secret(tmp_path: Path) -> None:
    """issue 16 item 6: these were printed in clear."""
    s = SECRETS
    config = tmp_path / "config.yaml"
    config.write_text(
        f"client_tokens: [{s['client_tokens']}]\n"
        f"admin_tokens: [{s['admin_tokens']}]\n"
        f"openclaw_token: {s['openclaw_token']}\n"
        f"multi_agent: {{api_key: {s['multi_agent.api_key']}}}\n"
        f"router: {{llm_api_key: {s['router.llm_api_key']}}}\n"
        f"toolbridge: {{llm_api_key: {s['toolbridge.llm_api_key']}, "
        f"vault_token: {s['toolbridge.vault_token']}}}\n"
        f"store: {{redis_url: 'redis://:{s['redis password']}@127.0.0.1:{closed_port()}/0'}}\n"
        "providers:\n"
        f"  - {{id: remote, endpoint: 'http://user:{s['provider URL password']}@127.0.0.1:"
        f"{closed_port()}/acp/rpc', auth_header: 'Bearer {s['auth_header']}'}}\n"
        f"  - {{id: local, kind: stdio, command: [{sys.executable}, -V], "
        f"env: [MY_API_KEY={s['provider env']}, OTHER_TOKEN={s['short provider env']}]}}\n"
    )
    for extra in ([], ["--json"]):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "xwm_bridge",
            "doctor",
            "--config",
            str(config),
            *extra,
            env=base_env(),
            cwd=str(ROOT),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        text = out.decode()
        assert "effective configuration" in text or '"config"' in text, err.decode()
        leaked = [name for name, value in s.items() if value in text]
        assert not leaked, f"doctor {' '.join(extra)} printed: {leaked}"
        assert "MY_API_KEY=********" in text
        assert "user" not in text or "********@127.0.0.1" in text
    doc = orjson.loads(out)
    assert doc["config"]["client_tokens"] == ["********"]
    assert doc["config"]["providers"][1]["env"] == ["MY_API_KEY=********", "OTHER_TOKEN=********"]
