"""Permission requests as a shared object (issue 13): every watcher sees a stdio
agent's pending request, the first valid answer wins from any transport, and
expiry, cancel and agent exit resolve it for everyone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import AUTH, StartBridge, rpc
from tests.integration.agent_helpers import agent_params, agent_provider
from tests.integration.test_websocket import recv, req


def config(tmp: Path, **agents: Any) -> dict[str, Any]:
    return {
        "providers": [agent_provider()],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20, **agents},
    }


async def next_permission(ws: aiohttp.ClientWebSocketResponse, type_: str) -> dict[str, Any]:
    while True:
        msg = await recv(ws, 20)
        params = msg.get("params") or {}
        is_permission = msg.get("method") == "bridge.event" and params.get("kind") == "permission"
        if is_permission and params["type"] == type_:
            return params


async def test_plain_http_turn_waits_and_any_transport_answers(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    target = tmp_path / "granted.txt"
    async with (
        http.ws_connect(bp.ws_url, headers=AUTH) as w1,
        http.ws_connect(bp.ws_url, headers=AUTH) as w2,
    ):
        for ws in (w1, w2):
            await ws.send_str(req("bridge.watch", {"kinds": ["permission"]}, rid="watch"))
            assert (await recv(ws))["params"]["type"] == "live"
        # a plain-JSON turn: it used to be rejected at once; now it waits for an answer
        turn = asyncio.ensure_future(
            rpc(
                http,
                bp.rpc_url,
                "session.start",
                agent_params("sh1", f"permission {target}", workingDirectory=str(tmp_path)),
            )
        )
        asked = await next_permission(w1, "requested")
        assert (await next_permission(w2, "requested"))["requestId"] == asked["requestId"]
        assert asked["state"] == "pending" and asked["sessionId"] == "sh1"
        assert [o["optionId"] for o in asked["options"]] == ["once", "always", "reject"]
        # it is in the store: a client that reconnects finds it
        listed = (await rpc(http, bp.rpc_url, "permission.list", {}))["result"]["requests"]
        assert [r["requestId"] for r in listed] == [asked["requestId"]]
        # the answer comes over WebSocket 2
        answer = {"sessionId": "sh1", "requestId": asked["requestId"], "optionId": "once"}
        await w2.send_str(req("session.permission", answer, rid="ans"))
        resolved = await next_permission(w1, "resolved")
        assert resolved["resolution"] == "selected" and resolved["outcome"] == "allow_once"
        assert resolved["answeredBy"]["transport"] == "ws"
        assert resolved["answeredBy"]["address"].startswith("127.0.0.1:")
        result = (await asyncio.wait_for(turn, 20))["result"]
    assert "permission granted (once)" in result["output"]
    assert target.exists()
    record = result["permissions"][0]
    assert record["requestId"] == asked["requestId"] and record["answeredBy"]["transport"] == "ws"
    # a second answer loses, and says who won
    late = await rpc(http, bp.rpc_url, "session.permission", {**answer, "optionId": "reject"})
    assert late["error"]["code"] == -32602
    assert (
        "already resolved" in late["error"]["message"]
        and "ws 127.0.0.1" in late["error"]["message"]
    )
    assert (await rpc(http, bp.rpc_url, "permission.list", {}))["result"]["requests"] == []
    done = (await rpc(http, bp.rpc_url, "permission.list", {"includeResolved": True}))["result"]
    assert any(
        r["requestId"] == asked["requestId"] and r["state"] == "resolved" for r in done["requests"]
    )
    # the decision is in the audit log, with who answered
    audits = [orjson.loads(line) for line in bp.logs if '"permission decision"' in line]
    assert any(a.get("by_transport") == "ws" and a.get("outcome") == "allow_once" for a in audits)
    assert all("toolCall" not in a and "rawInput" not in a for a in audits)


async def test_expiry_cancel_and_agent_exit_resolve_for_everyone(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(tmp_path, permission_timeout=0.6), tmp=tmp_path)
    async with http.ws_connect(bp.ws_url, headers=AUTH) as ws:
        await ws.send_str(req("bridge.watch", {"kinds": ["permission"]}, rid="watch"))
        assert (await recv(ws))["params"]["type"] == "live"

        # expiry: nobody answers
        turn = asyncio.ensure_future(
            rpc(http, bp.rpc_url, "session.start",
                agent_params("ex1", f"permission {tmp_path / 'a'}", workingDirectory=str(tmp_path)))
        )  # fmt: skip
        await next_permission(ws, "requested")
        gone = await next_permission(ws, "resolved")
        assert gone["resolution"] == "expired" and gone["outcome"] == "reject_once"
        result = (await asyncio.wait_for(turn, 20))["result"]
        assert "no answer within" in result["permissions"][0]["reason"]

        # cancel: the turn is cancelled while its request waits
        turn = asyncio.ensure_future(
            rpc(http, bp.rpc_url, "session.start",
                agent_params("ca1", f"permission {tmp_path / 'b'}", workingDirectory=str(tmp_path)))
        )  # fmt: skip
        asked = await next_permission(ws, "requested")
        await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "ca1"})
        gone = await next_permission(ws, "resolved")
        assert gone["requestId"] == asked["requestId"] and gone["resolution"] == "cancelled"
        await asyncio.wait_for(turn, 20)

        # agent exit: the agent dies with its request open
        turn = asyncio.ensure_future(
            rpc(http, bp.rpc_url, "session.start",
                agent_params("ax1", f"permcrash {tmp_path / 'c'}", workingDirectory=str(tmp_path)))
        )  # fmt: skip
        await next_permission(ws, "requested")
        gone = await next_permission(ws, "resolved")
        assert gone["resolution"] == "agent_exited" and "exited" in gone["reason"]
        result = (await asyncio.wait_for(turn, 20))["result"]
        assert result["success"] is False
    assert (await rpc(http, bp.rpc_url, "permission.list", {}))["result"]["requests"] == []
    # the operator's view: an expiry is a warning naming the session; each resolution counts
    audits = [orjson.loads(line) for line in bp.logs if '"permission decision"' in line]
    levels = {a["resolution"]: (a["level"], a["session_id"]) for a in audits}
    assert levels["expired"] == ("warning", "ex1"), audits
    assert levels["cancelled"][0] == levels["agent_exited"][0] == "info"
    assert all(a["provider"] == "fake" for a in audits)
    async with http.get(f"{bp.url}/metrics") as resp:
        text = await resp.text()
    for resolution in ("expired", "cancelled", "agent_exited"):
        series = f'xwm_permission_requests_total{{resolution="{resolution}"}} 1.0'
        assert series in text, resolution


async def test_sse_turn_stream_carries_the_resolution(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The turn's own stream gets the pending update and then its resolution."""
    from tests.integration.agent_helpers import sse_stream, typed

    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    events: list[dict[str, Any]] = []
    async for event in sse_stream(
        http, bp.rpc_url, "session.start",
        agent_params("ss1", f"permission {tmp_path / 'd'}", workingDirectory=str(tmp_path)),
    ):  # fmt: skip
        events.append(event)
        params = event.get("params") or {}
        if params.get("type") == "permission" and params.get("pending"):
            answer = {"sessionId": "ss1", "requestId": params["requestId"], "optionId": "reject"}
            await rpc(http, bp.rpc_url, "session.permission", answer)
    perms = typed(events, "permission")
    assert perms[0]["pending"] is True
    assert perms[1]["pending"] is False and perms[1]["requestId"] == perms[0]["requestId"]
    assert perms[1]["outcome"] == "reject_once" and perms[1]["answeredBy"]["transport"] == "http"
    assert "permission denied" in events[-1]["result"]["output"]


async def test_sse_turn_stream_carries_the_resolution_when_the_agent_exits(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The agent exits with its request open: the turn's own stream gets the request's
    resolution (``agent_exited``) before the turn's failed answer. The request's handler
    was cancelled with the agent's other requests before it could send it, so the
    stream's last word on the request was "pending" (watchers saw it resolved)."""
    from tests.integration.agent_helpers import sse_stream, typed

    bp = await start_bridge(config=config(tmp_path), tmp=tmp_path)
    events: list[dict[str, Any]] = []
    async for event in sse_stream(
        http, bp.rpc_url, "session.start",
        agent_params("sx1", f"permcrash {tmp_path / 'e'}", workingDirectory=str(tmp_path)),
    ):  # fmt: skip
        events.append(event)
    perms = typed(events, "permission")
    assert [p["pending"] for p in perms] == [True, False], perms
    assert perms[1]["requestId"] == perms[0]["requestId"]
    assert perms[1]["resolution"] == "agent_exited" and perms[1]["outcome"] == "cancelled"
    assert events[-1]["result"]["success"] is False


async def test_a_client_never_lists_another_clients_requests(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """With several client tokens, permission.list shows a client the requests of its
    own sessions only: a resolved request whose session was closed (so no session names
    an owner any more) was listed to every client, tool call and answerer included."""
    from tests.conftest import eventually
    from tests.integration.test_security import TOKEN_A, TOKEN_ADMIN, TOKEN_B, call

    cfg = {**config(tmp_path), "client_tokens": [TOKEN_A, TOKEN_B], "admin_tokens": [TOKEN_ADMIN]}
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url, target = bp.rpc_url, tmp_path / "secret-plan.txt"
    params = agent_params("a-perm", f"permission {target}", workingDirectory=str(tmp_path))
    turn = asyncio.ensure_future(call(http, url, TOKEN_A, "session.start", params))

    async def listed(token: str, **extra: Any) -> list[dict[str, Any]]:
        reply = await call(http, url, token, "permission.list", extra)
        requests: list[dict[str, Any]] = reply["result"]["requests"]
        return requests

    asked = (await eventually(lambda: listed(TOKEN_A)))[0]
    assert await listed(TOKEN_B) == []
    answer = {"sessionId": "a-perm", "requestId": asked["requestId"], "optionId": "once"}
    assert "result" in await call(http, url, TOKEN_A, "session.permission", answer)
    assert (await asyncio.wait_for(turn, 20))["result"]["success"] is True
    closed = await call(http, url, TOKEN_A, "session.close", {"sessionId": "a-perm"})
    assert closed["result"]["accepted"] is True
    assert [r["requestId"] for r in await listed(TOKEN_A, includeResolved=True)] == [
        asked["requestId"]
    ]
    assert await listed(TOKEN_B, includeResolved=True) == []
    admin = await listed(TOKEN_ADMIN, includeResolved=True)
    assert [r["requestId"] for r in admin] == [asked["requestId"]]


async def test_another_client_cannot_answer_while_the_session_closes(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """session.close takes the session out of the registry, then cancels its turn;
    until the cancel lands, the turn's permission request is still pending with no
    session to name an owner. The answer is checked against the principal the
    request itself records: another client is refused, an admin may answer."""
    from tests.conftest import eventually
    from tests.integration.test_security import TOKEN_A, TOKEN_ADMIN, TOKEN_B, call

    cfg = {**config(tmp_path), "client_tokens": [TOKEN_A, TOKEN_B], "admin_tokens": [TOKEN_ADMIN]}
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url, target = bp.rpc_url, tmp_path / "granted.txt"
    params = agent_params("closing", f"permission {target}", workingDirectory=str(tmp_path))
    turn = asyncio.ensure_future(call(http, url, TOKEN_A, "session.start", params))

    async def pending() -> list[dict[str, Any]]:
        reply = await call(http, url, TOKEN_ADMIN, "permission.list", {})
        requests: list[dict[str, Any]] = reply["result"]["requests"]
        return requests

    asked = (await eventually(pending))[0]
    # hold the close between the registry removal and the cancel of the turn
    sessions, held = bp.bridge.sessions, []
    monkeypatch.setattr(sessions, "cancel", lambda sid: held.append(sid) or True)
    closed = await call(http, url, TOKEN_A, "session.close", {"sessionId": "closing"})
    assert closed["result"]["closed"] is True and held == ["closing"]
    assert sessions.get("closing") is None

    async def record_gone() -> bool:  # the delete is through: no stored owner either
        return await bp.bridge.store.load("closing") is None

    await eventually(record_gone)
    answer = {"sessionId": "closing", "requestId": asked["requestId"], "optionId": "once"}
    stolen = await call(http, url, TOKEN_B, "session.permission", answer)
    assert stolen.get("error") == {"code": -32003, "message": "session belongs to another client"}
    assert [r["requestId"] for r in await pending()] == [asked["requestId"]]  # still open
    # an admin (the console) may answer any request
    admin = await call(
        http, url, TOKEN_ADMIN, "session.permission", {**answer, "optionId": "reject"}
    )
    assert admin["result"]["outcome"] == "reject_once"
    result = (await asyncio.wait_for(turn, 20))["result"]
    assert "permission denied" in result["output"] and not target.exists()
    monkeypatch.undo()
