"""``serve``'s ACP remote transport (``/acp/remote``): the official SDK's WebSocket and
Streamable HTTP clients, the RFD's HTTP semantics on the wire, auth and limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from acp import RequestError, connect_to_agent, image_block, text_block
from acp.client.connection import ClientSideConnection
from acp.http import create_http_stream
from acp.ws import create_websocket_stream

from tests.acp_schema import FrameChecker
from tests.conftest import (
    AUTH,
    TOKEN,
    FakeUpstream,
    StartBridge,
    log_entries,
    rpc,
    session_params,
    wait_until,
)
from tests.integration.acp_helpers import RecordingClient, caps, prompt
from tests.integration.agent_helpers import agent_provider
from xwm_bridge import inflight

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

JSON = {**AUTH, "Content-Type": "application/json"}


def config(upstream: FakeUpstream, tmp: Path, **extra: Any) -> dict[str, Any]:
    return {
        "providers": [
            {"id": "codex", "label": "Codex", "endpoint": upstream.url},
            agent_provider(),
        ],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20},
        "acp": {"default_route": "single-agent:codex"},
        **extra,
    }


@contextlib.asynccontextmanager
async def sdk_client(
    url: str,
    kind: str,
    client: RecordingClient | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[tuple[ClientSideConnection, RecordingClient, FrameChecker]]:
    headers = headers or AUTH
    if kind == "ws":
        transport = await create_websocket_stream(url.replace("http://", "ws://"), headers=headers)
    else:
        transport = create_http_stream(url, headers=headers)
    client = client or RecordingClient()
    checker = FrameChecker()
    conn = connect_to_agent(client, transport, observers=[checker])
    try:
        init = await asyncio.wait_for(
            conn.initialize(protocol_version=1, client_capabilities=caps()), 20
        )
        assert [m.id for m in init.auth_methods] == ["bearer"]  # remote: the bridge token
        yield conn, client, checker
    finally:
        await conn.close()
    checker.assert_clean()


@pytest.mark.parametrize("kind", ["ws", "http"])
async def test_streamed_turn_permission_and_cancel(
    kind: str, start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    target = tmp_path / "out.txt"
    async with sdk_client(f"{bp.url}/acp/remote", kind) as (conn, client, checker):
        await conn.authenticate(method_id="bearer")
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=prompt("over the wire"))
        assert answer.stop_reason == "end_turn"
        assert checker.text() == "echo: over the wire"
        assert len(checker.updates("agent_message_chunk")) == 3

        await conn.set_config_option(
            config_id="route", session_id=session.session_id, value="single-agent:fake"
        )
        answer = await conn.prompt(
            session_id=session.session_id, prompt=prompt(f"permission {target}")
        )
        assert answer.stop_reason == "end_turn" and len(client.asked) == 1
        assert target.read_text() == "written by fake agent\n"

        await conn.set_session_mode(session_id=session.session_id, mode_id="single-agent:codex")
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=prompt("slow:20000 x"))
        )
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        await wait_until(lambda: bool(fake_upstream.state.cancels), within=10)


async def test_a_dropped_connection_keeps_its_turn_and_resume_picks_it_up(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    async with sdk_client(url, "ws") as (conn, _, _checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=prompt("slow:1500 finish me"))
        )
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
    with contextlib.suppress(Exception):
        await turn  # the connection went away under it
    assert fake_upstream.state.active  # ...but the turn did not
    async with sdk_client(url, "ws") as (conn, _, checker):
        await conn.resume_session(cwd=str(tmp_path), session_id=session.session_id, mcp_servers=[])
        await wait_until(lambda: checker.text() == "echo: finish me", within=15)
    assert fake_upstream.state.completed == 1
    async with sdk_client(url, "http") as (conn, _, checker):
        await conn.load_session(cwd=str(tmp_path), session_id=session.session_id, mcp_servers=[])
        users = [u["content"]["text"] for u in checker.updates("user_message_chunk")]
        assert users == ["slow:1500 finish me"] and checker.text() == "echo: finish me"


async def asked_then_dropped(url: str, tmp_path: Path, target: Path) -> tuple[str, RecordingClient]:
    """A session whose turn asks the client a permission (to write ``target``) that the
    client never answers, and the client's connection then gone: the session id and
    that first client (what it was asked)."""
    first = RecordingClient(hold_permission=True)  # asked, never answers
    async with sdk_client(url, "ws", first) as (conn, _, _checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        await conn.set_config_option(config_id="route", session_id=sid, value="single-agent:fake")
        turn = asyncio.ensure_future(
            conn.prompt(session_id=sid, prompt=prompt(f"permission {target}"))
        )
        await asyncio.wait_for(first.permission_asked.wait(), 20)
    with contextlib.suppress(Exception):
        await turn  # its connection went away
    return sid, first


async def test_a_permission_open_when_the_connection_dropped_is_asked_on_resume(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The question went to the dropped connection only; the turn then waited for the
    broker's deadline and the agent was refused. Now the client that resumes is asked."""
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    target = tmp_path / "out.txt"
    sid, first = await asked_then_dropped(url, tmp_path, target)
    assert not target.exists()
    async with sdk_client(url, "ws") as (conn, second, checker):  # answers allow_once
        await conn.resume_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        await asyncio.wait_for(second.permission_asked.wait(), 20)
        live = bp.bridge.sessions.get(sid)
        assert live is not None
        await wait_until(lambda: live.last_turn_status == "completed", within=15)
        done = [u for u in checker.updates("tool_call_update") if u.get("status") == "completed"]
        assert done, checker.updates("tool_call_update")  # the agent's edit, after the allow
    assert target.read_text() == "written by fake agent\n"
    assert len(first.asked) == 1 and len(second.asked) == 1


async def test_a_permission_open_when_a_load_attaches_is_asked_after_its_replay(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The question still open is asked again of the client that loads the session, but
    after the replay: not before the replayed tool_call it is about (a client would see a
    permission for a tool call it does not know yet, then that call replayed over it)."""
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    target = tmp_path / "out.txt"
    sid, first = await asked_then_dropped(url, tmp_path, target)
    async with sdk_client(url, "ws") as (conn, second, checker):  # answers allow_once
        await conn.load_session(cwd=str(tmp_path), session_id=sid, mcp_servers=[])
        await asyncio.wait_for(second.permission_asked.wait(), 20)
        live = bp.bridge.sessions.get(sid)
        assert live is not None
        await wait_until(lambda: live.last_turn_status == "completed", within=15)
        frames = checker.frames
        (asked,) = [
            i for i, f in enumerate(frames) if f.get("method") == "session/request_permission"
        ]
        (tool_call,) = [
            i
            for i, f in enumerate(frames)
            if f.get("method") == "session/update"
            and f["params"]["update"]["sessionUpdate"] == "tool_call"
        ]
        question = frames[asked]["params"]["toolCall"]["toolCallId"]
        assert frames[tool_call]["params"]["update"]["toolCallId"] == question
        assert tool_call < asked, [f.get("method") or f.get("id") for f in frames]
    assert target.read_text() == "written by fake agent\n"
    assert len(first.asked) == 1 and len(second.asked) == 1


async def read_events(resp: aiohttp.ClientResponse, until: Any, within: float = 15) -> list[Any]:
    """SSE items (``keep-alive`` for a comment) until ``until(items)`` holds."""
    items: list[Any] = []
    buf = b""
    async with asyncio.timeout(within):
        while not until(items):
            buf += await resp.content.readany()
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                if block.startswith(b":"):
                    items.append("keep-alive")
                elif block.startswith(b"data: "):
                    items.append(orjson.loads(block[6:]))
    return items


async def test_streamable_http_on_the_wire(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import xwm_bridge.acp.remote as remote

    monkeypatch.setattr(remote, "KEEPALIVE_INTERVAL", 0.2)
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    url = f"{bp.url}/acp/remote"

    def post(body: Any, **headers: str) -> Any:
        return http.post(url, data=orjson.dumps(body), headers={**JSON, **headers})

    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    async with post(init) as resp:
        assert resp.status == 200
        cid = resp.headers["Acp-Connection-Id"]
        assert (await resp.json())["result"]["protocolVersion"] == 1
    sse = {**AUTH, "Accept": "text/event-stream", "Acp-Connection-Id": cid}
    async with http.get(url, headers=sse) as main:
        assert main.status == 200 and main.headers["Content-Type"] == "text/event-stream"
        new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(tmp_path)}}
        async with post(new, **{"Acp-Connection-Id": cid}) as resp:
            assert resp.status == 202
        (created,) = [
            e
            for e in await read_events(main, lambda xs: any(isinstance(x, dict) for x in xs))
            if isinstance(e, dict)
        ]
        sid = created["result"]["sessionId"]
        # a quiet stream sends keep-alive comments
        assert "keep-alive" in await read_events(main, lambda xs: "keep-alive" in xs, within=5)

        async with http.get(url, headers={**sse, "Acp-Session-Id": sid}) as stream:
            assert stream.status == 200
            ask = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]},
            }
            async with post(ask, **{"Acp-Connection-Id": cid}) as resp:
                assert resp.status == 400  # session-scoped without Acp-Session-Id
            async with post(ask, **{"Acp-Connection-Id": cid, "Acp-Session-Id": sid}) as resp:
                assert resp.status == 202
            events = await read_events(
                stream, lambda xs: any(isinstance(x, dict) and x.get("id") == 2 for x in xs)
            )
            frames = [e for e in events if isinstance(e, dict)]
            assert frames[-1] == {"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}
            text = "".join(f["params"]["update"]["content"]["text"] for f in frames[:-1])
            assert text == "echo: hi"
        async with http.get(url, headers={**sse, "Acp-Session-Id": "acp-unknown"}) as resp:
            assert resp.status == 404

        async with http.delete(url, headers={**AUTH, "Acp-Connection-Id": cid}) as resp:
            assert resp.status == 202
        ends = await read_events(main, lambda xs: True, within=5)  # the stream ends
        assert isinstance(ends, list)
    async with post(new, **{"Acp-Connection-Id": cid}) as resp:
        assert resp.status == 404


async def test_auth_origin_and_limits(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    cfg = config(
        fake_upstream, tmp_path, limits={"max_body_bytes": 4096, "max_ws_message_bytes": 4096}
    )
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    init = orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    ctype = {"Content-Type": "application/json"}
    async with http.post(url, data=init, headers=ctype) as resp:
        assert resp.status == 401
    async with http.post(
        url, data=init, headers={**ctype, "Authorization": "Bearer wrong"}
    ) as resp:
        assert resp.status == 401
    async with http.post(
        url, data=init, headers={**JSON, "Origin": "https://evil.example"}
    ) as resp:
        assert resp.status == 403
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await http.ws_connect(url.replace("http", "ws"))
    assert err.value.status == 401
    async with http.post(url, data=init, headers={**AUTH, "Content-Type": "text/plain"}) as resp:
        assert resp.status == 415
    async with http.post(url, data=b"[" + init + b"]", headers=JSON) as resp:
        assert resp.status == 501
    big = orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"x": "y" * 8000}}
    )
    async with http.post(url, data=big, headers=JSON) as resp:
        assert resp.status == 413
    note = orjson.dumps(
        {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "s"}}
    )
    async with http.post(url, data=note, headers=JSON) as resp:
        assert resp.status == 400  # no Acp-Connection-Id
    async with http.post(url, data=note, headers={**JSON, "Acp-Connection-Id": "nope"}) as resp:
        assert resp.status == 404
    async with http.get(url, headers={**AUTH, "Acp-Connection-Id": "nope"}) as resp:
        assert resp.status == 406  # Accept must include text/event-stream
    async with http.delete(url, headers=AUTH) as resp:
        assert resp.status == 400
    async with http.put(url, headers=AUTH) as resp:
        assert resp.status == 405
    # a WebSocket message over the limit closes the socket (1009)
    ws = await http.ws_connect(url.replace("http", "ws"), headers=AUTH)
    assert ws._response.headers.get("Acp-Connection-Id")
    await ws.send_str("x" * 8000)
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type in (
        aiohttp.WSMsgType.CLOSE,
        aiohttp.WSMsgType.CLOSED,
        aiohttp.WSMsgType.CLOSING,
    )
    assert ws.close_code == 1009
    await ws.close()
    _ = TOKEN


async def test_sessions_belong_to_their_principal(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    async with sdk_client(url, "ws") as (conn, _, _c):
        mine = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=mine.session_id, prompt=prompt("private"))
        listed = await conn.list_sessions(cwd=str(tmp_path))
        assert [s.session_id for s in listed.sessions] == [mine.session_id]
    theirs = {"Authorization": f"Bearer {other}"}
    async with sdk_client(url, "http", headers=theirs) as (conn, _, _c):
        assert (await conn.list_sessions(cwd=str(tmp_path))).sessions == []
        with pytest.raises(RequestError) as err:
            await conn.load_session(cwd=str(tmp_path), session_id=mine.session_id, mcp_servers=[])
        assert err.value.code == -32002
        with pytest.raises(RequestError):
            await conn.resume_session(cwd=str(tmp_path), session_id=mine.session_id, mcp_servers=[])


async def test_a_new_acp_session_is_its_principals_before_its_first_prompt(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """``session/new`` stored its bridge session with no owner (the first turn claimed
    it): until then another client listed it (``session.list``, its cwd), read it
    (``session.get``) and could take it with a turn of its own, after which the owner's
    own prompts found no session."""
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    theirs = {"Authorization": f"Bearer {other}"}
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, _c):
        mine = (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id
        listed = await rpc(http, bp.rpc_url, "session.list", {}, headers=theirs)
        assert [s["sessionId"] for s in listed["result"]["sessions"]] == []
        for method, params in (
            ("session.get", {"sessionId": mine}),
            ("session.replay", {"sessionId": mine}),
            ("session.message", session_params(mine, "taken")),
        ):
            reply = await rpc(http, bp.rpc_url, method, params, headers=theirs)
            assert reply.get("error", {}).get("code") == -32003, (method, reply)
        await conn.prompt(session_id=mine, prompt=prompt("still mine"))  # the owner's, as before
        listed = await rpc(http, bp.rpc_url, "session.list", {})
        assert [s["sessionId"] for s in listed["result"]["sessions"]] == [mine]


async def test_another_principals_bridge_session_is_not_loaded_over_acp(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    # a session of the bridge contract (/acp/rpc) has an owner but no acp.owner key:
    # another principal's session/load replayed its prompts and wrote acp.* keys into it
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    started = await rpc(http, bp.rpc_url, "session.start", session_params("owned", "my secret"))
    assert started["result"]["success"] is True
    theirs = {"Authorization": f"Bearer {other}"}
    url = f"{bp.url}/acp/remote"
    async with sdk_client(url, "ws", headers=theirs) as (conn, client, _c):
        for reopen in (conn.load_session, conn.resume_session):
            with pytest.raises(RequestError) as err:
                await reopen(cwd=str(tmp_path), session_id="owned", mcp_servers=[])
            assert err.value.code == -32002
        assert client.updates == []  # nothing of the owner's session replayed
    more = await rpc(http, bp.rpc_url, "session.message", session_params("owned", "again"))
    assert more["result"]["success"] is True  # the owner's session, untouched


async def test_a_connection_id_answers_only_the_principal_that_opened_it(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    async with http.post(url, data=orjson.dumps(init), headers=JSON) as resp:
        cid = resp.headers["Acp-Connection-Id"]
    theirs = {"Authorization": f"Bearer {other}", "Acp-Connection-Id": cid}
    new = {"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": str(tmp_path)}}
    body = orjson.dumps(new)
    async with http.post(
        url, data=body, headers={**theirs, "Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 404  # not a session created as the connection's principal
    async with http.get(url, headers={**theirs, "Accept": "text/event-stream"}) as resp:
        assert resp.status == 404  # nor its stream
    async with http.delete(url, headers=theirs) as resp:
        assert resp.status == 404  # nor closing it
    async with http.post(url, data=body, headers={**JSON, "Acp-Connection-Id": cid}) as resp:
        assert resp.status == 202  # the owner's token still uses it


async def test_idle_http_connections_are_closed(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    cfg = config(fake_upstream, tmp_path)
    cfg["acp"]["connection_idle_ttl"] = 0.4
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    init = orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    async with http.post(url, data=init, headers=JSON) as resp:
        cid = resp.headers["Acp-Connection-Id"]
    note = orjson.dumps({"jsonrpc": "2.0", "method": "_ping", "params": {}})
    headers = {**JSON, "Acp-Connection-Id": cid}
    async with http.post(url, data=note, headers=headers) as resp:
        assert resp.status == 202
    # no stream and no request for longer than the TTL: the reaper closes it (polling it
    # with requests would keep it alive, so the daemon's log line is the event)

    def closed() -> list[dict[str, Any]]:
        return [
            e
            for e in log_entries(bp.logs)
            if e.get("msg") == "ACP connection closed" and e.get("connection") == cid[:8]
        ]

    await wait_until(lambda: bool(closed()), 10)
    assert closed()[0]["reason"] == "idle"
    async with http.post(url, data=note, headers=headers) as resp:
        assert resp.status == 404


async def test_requests_past_the_in_flight_limit_are_refused(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inflight, "MAX_INFLIGHT_PER_CONNECTION", 1)
    cfg = {
        "providers": [{"id": "codex", "label": "Codex", "endpoint": fake_upstream.url}],
        "allowed_roots": [str(tmp_path)],
        "acp": {"default_route": "single-agent:codex"},
    }
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _client, _checker):
        await conn.authenticate(method_id="bearer")
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=prompt("slow:20000 x"))
        )
        try:
            await wait_until(lambda: bool(fake_upstream.state.active), within=15)
            with pytest.raises(RequestError) as refused:
                await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            assert refused.value.code == -32004
            assert "limit 1" in str(refused.value)
            await conn.cancel(session_id=session.session_id)  # a cancel passes the limit
            assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        finally:
            turn.cancel()
        assert (await conn.new_session(cwd=str(tmp_path), mcp_servers=[])).session_id


async def test_cancel_and_close_reach_the_turn_when_clients_have_tokens_of_their_own(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # several principals (client_tokens): the owner's session/cancel and session/close act
    # on its session as on a single-token bridge; another principal's touch nothing
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    theirs = {"Authorization": f"Bearer {other}"}
    async with sdk_client(url, "ws") as (conn, _, _checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        hold = fake_upstream.state.holds[sid] = asyncio.Event()
        turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("held")))
        await wait_until(lambda: sid in fake_upstream.state.active, within=15)
        async with sdk_client(url, "ws", headers=theirs) as (intruder, _, _c):
            await intruder.cancel(session_id=sid)
            with pytest.raises(RequestError) as err:
                await intruder.close_session(session_id=sid)
            assert err.value.code == -32002
        hold.set()
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "end_turn"
        assert not fake_upstream.state.cancels
        del fake_upstream.state.holds[sid]

        turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("slow:20000 x")))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        await wait_until(lambda: len(fake_upstream.state.cancels) == 1, within=10)

        turn = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("slow:20000 y")))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await conn.close_session(session_id=sid)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        await wait_until(lambda: len(fake_upstream.state.cancels) == 2, within=10)


async def test_sessions_past_the_live_bound_reopen_from_the_store(
    monkeypatch: pytest.MonkeyPatch,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    """One connection opening more sessions than the front keeps in memory: the idle
    ones leave memory, and a prompt, option or close naming one still works."""
    from acp.schema import McpServerStdio

    from xwm_bridge.acp import sessions as acp_sessions

    monkeypatch.setattr(acp_sessions, "MAX_LIVE_SESSIONS", 2)
    cfg = config(fake_upstream, tmp_path)
    cfg["providers"][1]["client_mcp_servers"] = True
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    tools = McpServerStdio(name="tb", command="true", args=[], env=[])
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, checker):
        first = await conn.new_session(cwd=str(tmp_path), mcp_servers=[tools])
        await conn.set_config_option(
            config_id="route", session_id=first.session_id, value="single-agent:fake"
        )
        others = [await conn.new_session(cwd=str(tmp_path), mcp_servers=[]) for _ in range(3)]
        answer = await conn.prompt(session_id=first.session_id, prompt=prompt("mcp"))
        assert answer.stop_reason == "end_turn"
        assert checker.text().endswith("mcp: tb:stdio")  # route and MCP servers came back
        options = await conn.set_config_option(
            config_id="route", session_id=others[0].session_id, value="single-agent:codex"
        )
        assert options.config_options[0].current_value == "single-agent:codex"
        await conn.close_session(session_id=others[1].session_id)
        with pytest.raises(RequestError) as err:  # closed stays closed
            await conn.prompt(session_id=others[1].session_id, prompt=prompt("closed"))
        assert err.value.code == -32002
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, _c):
        with pytest.raises(RequestError) as err:  # another connection must load it first
            await conn.prompt(session_id=others[2].session_id, prompt=prompt("not mine"))
        assert err.value.code == -32002


async def test_a_session_stream_of_another_principal_s_session_is_not_found(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """A GET with another client's session id answered 200 (no events), which told
    that the id exists; now it is 404, as for an id nobody has."""
    other = "other-client-token-42"
    cfg = config(fake_upstream, tmp_path, client_tokens=[other])
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    started = await rpc(http, bp.rpc_url, "session.start", session_params("owned", "hi"))
    assert started["result"]["success"] is True
    url = f"{bp.url}/acp/remote"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    theirs = {"Authorization": f"Bearer {other}", "Content-Type": "application/json"}
    async with http.post(url, data=orjson.dumps(init), headers=theirs) as resp:
        cid = resp.headers["Acp-Connection-Id"]
    stream = {"Authorization": f"Bearer {other}", "Acp-Connection-Id": cid}
    stream["Accept"] = "text/event-stream"
    for sid in ("owned", "nobody-has-this-id"):
        async with http.get(url, headers={**stream, "Acp-Session-Id": sid}) as resp:
            assert resp.status == 404, sid
    async with http.post(url, data=orjson.dumps(init), headers=JSON) as resp:
        mine = resp.headers["Acp-Connection-Id"]
    own = {**JSON, "Acp-Connection-Id": mine, "Accept": "text/event-stream"}
    async with (
        asyncio.timeout(10),
        http.get(url, headers={**own, "Acp-Session-Id": "owned"}) as resp,
    ):
        assert resp.status == 200  # the owner's own stream of it


async def test_images_are_offered_once_an_agent_said_it_takes_them(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # promptCapabilities.image follows what the stdio agents' own initialize said; each
    # connection's prompts are held to what its initialize was told
    cfg = config(fake_upstream, tmp_path)
    cfg["providers"][1]["env"] = ["FAKE_AGENT_PROMPT_CAPS=image"]
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    blocks = [text_block("describe"), image_block("iVBORw0KGgo=", "image/png")]

    async def offers_images(conn: ClientSideConnection) -> bool:
        init = await conn.initialize(protocol_version=1, client_capabilities=caps())
        prompt_caps = init.agent_capabilities and init.agent_capabilities.prompt_capabilities
        return bool(prompt_caps and prompt_caps.image)

    async with sdk_client(url, "ws") as (first, _, _):
        assert not await offers_images(first)  # HTTP upstreams, and an agent not run yet
        session = await first.new_session(
            cwd=str(tmp_path), mcp_servers=[], **{"xwm-bridge/route": "single-agent:fake"}
        )
        await first.prompt(session_id=session.session_id, prompt=prompt("hi"))  # it runs
        async with sdk_client(url, "ws") as (second, _, checker):
            assert await offers_images(second)
            other = await second.new_session(
                cwd=str(tmp_path), mcp_servers=[], **{"xwm-bridge/route": "single-agent:fake"}
            )
            answer = await second.prompt(session_id=other.session_id, prompt=blocks)
            assert answer.stop_reason == "end_turn"
            assert checker.text() == "text,image:image/png"
        with pytest.raises(RequestError) as err:  # this client was told: no images
            await first.prompt(session_id=session.session_id, prompt=blocks)
        assert err.value.code == -32602


async def test_refusals_are_counted_and_logged(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """A refused body or frame on /acp/remote shows in xwm_rejected_requests_total and
    has its "request rejected" line, as on /acp/rpc and /acp."""
    cfg = config(
        fake_upstream, tmp_path, limits={"max_body_bytes": 4096, "max_ws_message_bytes": 4096}
    )
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    big = orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"x": "y" * 8000}}
    )
    async with http.post(url, data=big, headers=JSON) as resp:
        assert resp.status == 413
    ws = await http.ws_connect(url.replace("http", "ws"), headers=AUTH)
    await ws.send_str("x" * 8000)
    msg = await asyncio.wait_for(ws.receive(), 10)
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    await ws.close()
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await http.ws_connect(url.replace("http", "ws"))  # no token
    async with http.get(f"{bp.url}/metrics") as resp:
        samples = (await resp.text()).splitlines()
    for transport, reason in (
        ("http", "body_too_large"),
        ("ws", "message_too_large"),
        ("ws", "missing_token"),
    ):
        sample = f'xwm_rejected_requests_total{{reason="{reason}",transport="{transport}"}} 1.0'
        assert sample in samples, sample

    def refused() -> list[dict[str, Any]]:
        return [e for e in log_entries(bp.logs) if e.get("msg") == "request rejected"]

    await wait_until(lambda: len(refused()) == 3)
    by_reason = {e["reason"]: e for e in refused()}
    assert by_reason["body_too_large"]["status"] == 413
    assert by_reason["message_too_large"]["ws_close"] == 1009
    assert {e["path"] for e in refused()} == {"/acp/remote"}


async def test_a_connection_past_the_limit_is_counted_and_logged(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """``acp.max_connections`` reached: the 503 shows in xwm_rejected_requests_total
    (``too_many_connections``) and in the log, as every other refusal."""
    acp = {"default_route": "single-agent:codex", "max_connections": 1}
    bp = await start_bridge(config=config(fake_upstream, tmp_path, acp=acp), tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    init = orjson.dumps(
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}
    )
    async with http.ws_connect(url.replace("http", "ws"), headers=AUTH):
        with pytest.raises(aiohttp.WSServerHandshakeError) as err:
            await http.ws_connect(url.replace("http", "ws"), headers=AUTH)
        assert err.value.status == 503
        async with http.post(url, data=init, headers=JSON) as resp:
            assert resp.status == 503
    async with http.get(f"{bp.url}/metrics") as resp:
        samples = (await resp.text()).splitlines()
    for transport in ("ws", "http"):
        sample = (
            'xwm_rejected_requests_total{reason="too_many_connections",'
            f'transport="{transport}"}} 1.0'
        )
        assert sample in samples, sample

    def refused() -> list[dict[str, Any]]:
        return [e for e in log_entries(bp.logs) if e.get("msg") == "request rejected"]

    await wait_until(lambda: len(refused()) == 2)
    assert {(e["reason"], e["status"]) for e in refused()} == {("too_many_connections", 503)}
