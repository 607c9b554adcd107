"""What a hostile or unlucky peer can do (issue 16 items 1-4), against the real daemon.

Every bad input gets a JSON-RPC error on the transport it came from; nothing a
client, upstream, agent or gateway sends can stop the session store; replies are
read to their end; bad values are ``-32602``, not ``-32603``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import (
    AUTH,
    ROOT,
    TOKEN,
    ServeApp,
    StartBridge,
    base_env,
    providers_config,
    rpc,
    scripted_app,
    session_params,
    sse,
)
from tests.nesting import nested_json

DEEP = 300  # past the 254 levels orjson writes, inside the 1024 it reads


def deep_id_request(method: str = "acp.capabilities") -> bytes:
    return f'{{"jsonrpc":"2.0","id":{nested_json(DEEP)},"method":"{method}"}}'.encode()


def deep_session_request(rid: int = 5) -> bytes:
    return (
        f'{{"jsonrpc":"2.0","id":{rid},"method":"session.start",'
        f'"params":{{"sessionId":{nested_json(DEEP)},"taskPrompt":"x"}}}}'
    ).encode()


async def post_raw(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, Any]:
    async with http.post(url, data=body, headers=AUTH) as resp:
        return resp.status, orjson.loads(await resp.read())


# --- item 3: nesting on every client transport ----------------------------------------


async def test_http_answers_deep_ids_and_params_with_a_jsonrpc_error(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    status, body = await post_raw(http, bridge.rpc_url, deep_id_request())
    assert status == 400 and body["id"] is None and body["error"]["code"] == -32600
    status, body = await post_raw(http, bridge.rpc_url, deep_session_request(5))
    assert status == 400 and body["id"] == 5 and body["error"]["code"] == -32602
    # and the daemon still serves
    assert (await rpc(http, bridge.rpc_url, "acp.capabilities"))["result"]


async def test_websocket_answers_deep_frames(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    async with http.ws_connect(bridge.ws_url, headers=AUTH) as ws:
        await ws.send_str(deep_id_request().decode())
        first = orjson.loads((await ws.receive(timeout=5)).data)
        await ws.send_str(deep_session_request(6).decode())
        second = orjson.loads((await ws.receive(timeout=5)).data)
        await ws.send_str('{"jsonrpc":"2.0","id":7,"method":"acp.capabilities"}')
        third = orjson.loads((await ws.receive(timeout=5)).data)
    assert first["error"]["code"] == -32600
    assert (second["id"], second["error"]["code"]) == (6, -32602)
    assert third["id"] == 7 and "result" in third


async def _stdio(mode: str, payload: bytes, env: dict[str, str]) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        mode,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
    )
    out, err = await asyncio.wait_for(proc.communicate(payload), 30)
    assert proc.returncode == 0, err.decode()
    assert b"Task exception was never retrieved" not in err
    return [orjson.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("mode", ["acp-stdio", "toolbridge"])
async def test_stdio_modes_answer_deep_frames(mode: str) -> None:
    tail = b'{"jsonrpc":"2.0","id":9,"method":"ping"}\n'
    payload = deep_id_request() + b"\n" + deep_session_request(8) + b"\n" + tail
    replies = await _stdio(mode, payload, base_env())
    assert len(replies) == 3
    assert replies[0]["error"]["code"] == -32600
    assert (replies[1]["id"], replies[1]["error"]["code"]) == (8, -32602)
    assert replies[2]["id"] == 9  # ping: a result (toolbridge) or method not found


def deep_result_app(seen: list[dict[str, Any]]) -> web.Application:
    def reply(body: dict[str, Any]) -> bytes:
        return f'{{"jsonrpc":"2.0","id":"{body["id"]}","result":{nested_json(DEEP)}}}'.encode()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        seen.append(body)
        return web.Response(body=reply(body), content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    return app


async def test_a_deep_upstream_result_fails_the_turn_cleanly(
    start_bridge: StartBridge, http: aiohttp.ClientSession, serve_app: ServeApp, tmp_path: Path
) -> None:
    seen: list[dict[str, Any]] = []
    url = await serve_app(deep_result_app(seen))
    config = providers_config({"id": "codex", "endpoint": url, "stream": False})
    bridge = await start_bridge(config=config, tmp=tmp_path)
    reply = await rpc(http, bridge.rpc_url, "session.start", session_params("deep-up", "hi"))
    assert reply["result"]["success"] is False
    assert "nested deeper than 64 levels" in reply["result"]["error"]
    # the session and its ledger were stored as usual
    replay = await rpc(http, bridge.rpc_url, "session.replay", {"sessionId": "deep-up"})
    assert replay["result"]["found"] is True and replay["result"]["lastTurnStatus"] == "failed"


async def test_a_deep_upstream_notification_is_not_relayed_and_the_store_goes_on(
    start_bridge: StartBridge, http: aiohttp.ClientSession, serve_app: ServeApp, tmp_path: Path
) -> None:
    """Before issue 16, this one notification ended the SQLite writer thread."""

    async def handle(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        deep = f'{{"jsonrpc":"2.0","method":"session.update","params":{nested_json(DEEP)}}}'
        await resp.write(b"data: " + deep.encode() + b"\n\n")
        ok = {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True, "output": "done"}}
        await resp.write(b"data: " + orjson.dumps(ok) + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    url = await serve_app(app)
    bridge = await start_bridge(
        config=providers_config({"id": "codex", "endpoint": url}), tmp=tmp_path
    )
    events = await sse(http, bridge.rpc_url, "session.start", session_params("deep-n", "hi"))
    final = events[-1]
    assert final["result"]["success"] is True and final["result"]["output"] == "done"
    assert not any(isinstance(e, dict) and e.get("params", {}).get("k") is not None for e in events)
    for i in range(3):  # later sessions are written and read back at once
        await rpc(http, bridge.rpc_url, "session.start", session_params(f"later-{i}", "hi"))
        async with asyncio.timeout(5):
            replay = await rpc(http, bridge.rpc_url, "session.replay", {"sessionId": f"later-{i}"})
        assert replay["result"]["found"] is True and replay["result"]["notifications"]
    async with http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 200


# --- item 1: a dead or failing store is visible -----------------------------------------


async def metrics_text(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as resp:
        return await resp.text()


async def test_a_store_that_cannot_write_makes_readyz_fail_and_shows_in_metrics(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    store = bridge.bridge.store
    async with http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 200
    assert "xwm_store_up 1.0" in await metrics_text(http, bridge.url)

    await store._call(lambda db: db.execute("PRAGMA query_only = ON"))  # writes now fail
    await rpc(http, bridge.rpc_url, "session.close", {"sessionId": "gone"})  # one write
    await asyncio.wait_for(store._call(lambda db: None), 5)  # that write has been tried
    text = await metrics_text(http, bridge.url)
    assert "xwm_store_up 0.0" in text
    assert 'xwm_store_errors_total{kind="write"} 1.0' in text
    async with http.get(f"{bridge.url}/readyz") as resp:
        body = await resp.json()
        assert resp.status == 503
    assert body["reason"] == "session store not writable"
    assert body["store"]["backend"] == "sqlite" and body["store"]["ok"] is False
    assert "sessions.db" in body["store"]["error"]

    await store._call(lambda db: db.execute("PRAGMA query_only = OFF"))
    async with http.get(f"{bridge.url}/readyz") as resp:  # its own probe is not enough
        assert resp.status == 503
        assert "writes failing" in (await resp.json())["store"]["error"]
    await rpc(http, bridge.rpc_url, "session.close", {"sessionId": "gone-2"})  # a real write
    await asyncio.wait_for(store._call(lambda db: None), 5)
    async with http.get(f"{bridge.url}/readyz") as resp:
        assert resp.status == 200
    assert "xwm_store_up 1.0" in await metrics_text(http, bridge.url)


async def test_a_dead_store_thread_shows_in_metrics_and_restarts(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge()
    store = bridge.bridge.store
    store._ops.put(("stop",))  # the writer thread ends, as a crash would end it
    await asyncio.to_thread(store._thread.join, 5)
    assert "xwm_store_up 0.0" in await metrics_text(http, bridge.url)
    async with http.get(f"{bridge.url}/readyz") as resp:  # the probe restarts it
        assert resp.status == 200
    text = await metrics_text(http, bridge.url)
    assert "xwm_store_up 1.0" in text and 'xwm_store_errors_total{kind="restart"} 1.0' in text
    await rpc(
        http, bridge.rpc_url, "session.start", {"sessionId": "after-restart", "taskPrompt": "x"}
    )
    replay = await rpc(http, bridge.rpc_url, "session.replay", {"sessionId": "after-restart"})
    assert "result" in replay


# --- item 2: long plain-JSON replies are read to their end -----------------------------


@pytest.mark.parametrize("size", [1024, 130 * 1024, 1024 * 1024, 8 * 1024 * 1024])
async def test_plain_json_upstream_replies_of_any_size(
    size: int,
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    serve_app: ServeApp,
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    output = "o" * size

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True, "output": output}}

    url = await serve_app(scripted_app(reply, seen))
    config = providers_config({"id": "codex", "endpoint": url, "stream": False})
    bridge = await start_bridge(config=config, tmp=tmp_path)
    result = (await rpc(http, bridge.rpc_url, "session.start", session_params("big", "x")))[
        "result"
    ]
    assert result["success"] is True, result.get("error")
    assert result["output"] == output


async def test_bootstrap_reads_a_long_accounts_reply(
    start_bridge: StartBridge, http: aiohttp.ClientSession, serve_app: ServeApp
) -> None:
    async def consume(request: web.Request) -> web.Response:
        body = {"BRIDGE_AUTH_TOKEN": "t", "BRIDGE_SERVER_URL": "u", "padding": "p" * 200_000}
        return web.json_response(body)

    app = web.Application()
    app.router.add_post("/api/internal/xworkmate/bridge/bootstrap/consume", consume)
    accounts = await serve_app(app)
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN, INTERNAL_SERVICE_TOKEN="svc-tok-123", ACCOUNTS_BASE_URL=accounts
    )
    bridge = await start_bridge(env=env)
    async with http.post(
        f"{bridge.url}/bridge/bootstrap/consume", data=orjson.dumps({"ticket": "t1"})
    ) as resp:
        assert resp.status == 200, await resp.text()
        body = await resp.json()
    assert orjson.loads(body["setupCode"])["BRIDGE_AUTH_TOKEN"] == "t"


# --- item 4: bad values are -32602 at the boundary -------------------------------------


@pytest.mark.parametrize(
    ("method", "params"),
    [
        (
            "session.start",
            {"sessionId": "nul-1", "taskPrompt": "x", "workingDirectory": "/tmp/a\0b"},
        ),
        ("session.message", {"sessionId": "nul-2", "taskPrompt": "x", "workingDirectory": "a\0"}),
        ("xworkmate.routing.resolve", {"taskPrompt": "x", "workingDirectory": "/tmp/\0"}),
        ("xworkmate.mounts.reconcile", {"codexHome": "/tmp/x\0y"}),
        ("xworkmate.mounts.reconcile", {"opencodeHome": "\0"}),
        ("session.replay", {"sessionId": "s", "afterSeq": 2**63}),
        ("session.replay", {"sessionId": "s", "afterSeq": 2**64 - 1}),
        ("session.replay", {"sessionId": "s", "afterSeq": 2**62}),
        ("xworkmate.mounts.reconcile", {"aris": {"llmChatServerPath": "/x\0"}}),
    ],
)
async def test_bad_values_are_invalid_params(
    start_bridge: StartBridge, http: aiohttp.ClientSession, method: str, params: dict[str, Any]
) -> None:
    bridge = await start_bridge()
    routing = {"routing": {"routingMode": "explicit", "explicitExecutionTarget": "singleAgent"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, **routing}}
    async with http.post(bridge.rpc_url, data=orjson.dumps(body), headers=AUTH) as resp:
        assert resp.status == 200
        reply = await resp.json()
    assert reply["error"]["code"] == -32602, reply


@pytest.mark.parametrize(
    "after", ["9" * 20, "18446744073709551616", "9223372036854775808", "٣", "²", "-1", "1e3"]
)
async def test_bad_catch_up_positions_are_400_invalid_params(
    start_bridge: StartBridge, http: aiohttp.ClientSession, after: str
) -> None:
    bridge = await start_bridge()
    url = f"{bridge.url}/acp/sessions/s1/events"
    for headers, params in (({**AUTH, "Last-Event-ID": after}, {}), (AUTH, {"afterSeq": after})):
        async with http.get(url, headers=headers, params=params) as resp:
            assert resp.status == 400, await resp.text()
            assert (await resp.json())["error"]["code"] == -32602


# --- item 12: bounds by bytes ---------------------------------------------------------


async def test_client_supplied_fields_are_capped_in_every_log_line(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: Any
) -> None:
    from tests.conftest import provider_env

    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    huge = "s" * 3_000_000  # a 3 MB sessionId wrote a 3 MB "turn finished" line
    reply = await rpc(http, bridge.rpc_url, "session.start", session_params(huge, "hi"))
    assert reply["result"]["success"] is True
    lines = bridge.logs
    assert any('"turn finished"' in line for line in lines)
    assert max(len(line) for line in lines) < 16_384


async def test_big_prompts_are_bounded_in_history_and_replay(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: Any, tmp_path: Path
) -> None:
    """64 prompts of 3.9 MiB grew RSS by 437 MiB and made session.replay take 9.3 s."""
    from tests.conftest import provider_env

    config = {"store": {"history_max_bytes": 200_000, "ledger_max_bytes": 400_000}}
    bridge = await start_bridge(env=provider_env(fake_upstream.url), config=config, tmp=tmp_path)
    prompt = "p" * 50_000
    for i in range(8):
        reply = await rpc(http, bridge.rpc_url, "session.message", session_params("big", prompt))
        assert reply["result"]["success"] is True, i
    session = bridge.bridge.sessions.get("big")
    assert session is not None and sum(map(len, session.history)) <= 200_000
    async with http.post(
        bridge.rpc_url,
        data=orjson.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "session.replay", "params": {"sessionId": "big"}}
        ),
        headers=AUTH,
    ) as resp:
        body = await resp.read()
    assert len(body) <= 400_000 + 20_000  # the ledger's cap, plus the envelope
    result = orjson.loads(body)["result"]
    assert result["notifications"] and result["results"]  # the newest turns are there
    assert len(result["results"]) < 8  # the oldest were trimmed
