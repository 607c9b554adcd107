"""Cancelling ACP prompts: ``session/cancel`` while a prompt reopens its session from the
store, and ACP's request cancellation (``$/cancel_request {requestId}``) of one prompt.
Raw JSON-RPC frames on the in-process daemon's ``/acp/remote`` WebSocket (the SDK's
client has no call that sends ``$/cancel_request`` for a prompt)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import AUTH, TOKEN, FakeUpstream, StartBridge, base_env, wait_until
from tests.integration.test_acp_conformance import send, ws_url
from tests.integration.test_acp_remote import config
from tests.redis_server import redis_server
from xwm_bridge.acp import sessions as acp_sessions
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.acp.methods import AcpMethods

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

WS = aiohttp.ClientWebSocketResponse


class Peer:
    """One raw ACP connection: requests by id, answers collected as they come."""

    def __init__(self, ws: WS) -> None:
        self.ws = ws
        self.answers: dict[Any, dict[str, Any]] = {}

    async def request(self, rid: Any, method: str, params: dict[str, Any]) -> None:
        await send(self.ws, {"id": rid, "method": method, "params": params})

    async def answer(self, rid: Any) -> dict[str, Any]:
        while rid not in self.answers:
            msg = await asyncio.wait_for(self.ws.receive(), 20)
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            frame = orjson.loads(msg.data)
            if "method" not in frame:
                self.answers[frame.get("id")] = frame
        return self.answers.pop(rid)

    async def call(self, rid: Any, method: str, params: dict[str, Any]) -> Any:
        await self.request(rid, method, params)
        frame = await self.answer(rid)
        assert "error" not in frame, frame
        return frame["result"]

    async def new_session(self, rid: Any, cwd: Path) -> str:
        result = await self.call(rid, "session/new", {"cwd": str(cwd), "mcpServers": []})
        return str(result["sessionId"])


class HeldReopen:
    """A session of this connection that left memory (past a live bound of 2), and the
    store read of a prompt's reopen of it (``AcpFrontDoor.find`` without a cwd; a
    ``session/load`` passes one) held until :attr:`release` is set; :attr:`reading`
    once it is held."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.target = ""
        self.reading, self.release = asyncio.Event(), asyncio.Event()
        real_find = AcpFrontDoor.find

        async def find(front: AcpFrontDoor, sid: str, cwd: str, principal: str) -> Any:
            if sid == self.target and not cwd:
                self.reading.set()
                await asyncio.wait_for(self.release.wait(), 30)
            return await real_find(front, sid, cwd, principal)

        monkeypatch.setattr(acp_sessions, "MAX_LIVE_SESSIONS", 2)
        monkeypatch.setattr(AcpFrontDoor, "find", find)

    async def forgotten_session(self, peer: Peer, cwd: Path) -> str:
        """``initialize``, then the target session, pushed out of memory by three newer."""
        await peer.call(0, "initialize", {"protocolVersion": 1})
        self.target = await peer.new_session(1, cwd)
        for rid in range(2, 5):
            await peer.new_session(rid, cwd)
        return self.target


def prompt(sid: str, text: str) -> dict[str, Any]:
    return {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}


def cancel_request(rid: Any) -> dict[str, Any]:
    return {"method": "$/cancel_request", "params": {"requestId": rid}}


async def test_a_cancel_while_the_prompt_reopens_its_session_cancels_it(
    monkeypatch: pytest.MonkeyPatch,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # a session of this connection left memory (past the live bound): the prompt reads it
    # back from the store, and a session/cancel that lands during that read must still
    # answer the prompt cancelled (ACP: MUST), its turn never reaching the upstream
    held = HeldReopen(monkeypatch)
    cancel_served = asyncio.Event()
    real_cancel = AcpMethods.session_cancel

    async def session_cancel(methods: AcpMethods, *args: Any) -> dict[str, Any]:
        out = await real_cancel(methods, *args)
        cancel_served.set()
        return out

    monkeypatch.setattr(AcpMethods, "session_cancel", session_cancel)
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        target = await held.forgotten_session(peer, tmp_path)
        await peer.request("p", "session/prompt", prompt(target, "reopened"))
        await asyncio.wait_for(held.reading.wait(), 20)
        await send(ws, {"method": "session/cancel", "params": {"sessionId": target}})
        await asyncio.wait_for(cancel_served.wait(), 20)
        held.release.set()
        answer = await peer.answer("p")
        assert answer.get("result") == {"stopReason": "cancelled"}, answer
        after = await peer.call("q", "session/prompt", prompt(target, "after"))
        assert after == {"stopReason": "end_turn"}
    sent = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
    assert [r["params"]["taskPrompt"] for r in sent] == ["after"]


async def test_a_close_while_the_prompt_reopens_its_session_cancels_it_and_closes(
    monkeypatch: pytest.MonkeyPatch,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # as above, with session/close: it waits for the reopen (it answered -32002 "not
    # active" and the prompt ran on), the prompt answers cancelled, the session is closed
    held = HeldReopen(monkeypatch)
    closing = asyncio.Event()
    real_close = AcpMethods.session_close

    async def session_close(methods: AcpMethods, *args: Any) -> dict[str, Any]:
        closing.set()  # the close runs up to its first wait before the test goes on
        return await real_close(methods, *args)

    monkeypatch.setattr(AcpMethods, "session_close", session_close)
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        target = await held.forgotten_session(peer, tmp_path)
        await peer.request("p", "session/prompt", prompt(target, "reopened"))
        await asyncio.wait_for(held.reading.wait(), 20)
        await peer.request("c", "session/close", {"sessionId": target})
        await asyncio.wait_for(closing.wait(), 20)
        held.release.set()
        assert (await peer.answer("p")).get("result") == {"stopReason": "cancelled"}
        closed = await peer.answer("c")
        assert closed.get("result") == {}, closed
        await peer.request("q", "session/prompt", prompt(target, "after"))
        again = await peer.answer("q")
        assert again.get("error", {}).get("code") == -32002, again
    sent = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
    assert sent == []


async def test_requests_naming_a_session_being_reopened_wait_for_it(
    monkeypatch: pytest.MonkeyPatch,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    # a prompt reopens a session that left memory; an option change and a second prompt
    # of the same session, sent during that store read, wait for it instead of failing
    # "not open on this connection" (the first request took the connection's memory of it)
    held = HeldReopen(monkeypatch)
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        target = await held.forgotten_session(peer, tmp_path)
        await peer.request("p", "session/prompt", prompt(target, "one"))
        await asyncio.wait_for(held.reading.wait(), 20)
        route = {"sessionId": target, "configId": "route", "value": "single-agent:fake"}
        await peer.request("c", "session/set_config_option", route)
        await peer.request("p2", "session/prompt", prompt(target, "two"))
        await peer.call("list", "session/list", {})  # a round trip: both are waiting
        held.release.set()
        for rid in ("p", "c", "p2"):
            answer = await peer.answer(rid)
            assert "error" not in answer, answer


async def test_cancel_request_of_the_running_prompt_cancels_its_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        await peer.call(0, "initialize", {"protocolVersion": 1})
        sid = await peer.new_session(1, tmp_path)
        await peer.request(7, "session/prompt", prompt(sid, "slow:20000 a"))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await send(ws, cancel_request("7"))  # "7" is not 7: another id, ignored
        await send(ws, cancel_request(7))
        answer = await peer.answer(7)
        assert answer.get("result") == {"stopReason": "cancelled"}, answer
        await wait_until(lambda: len(fake_upstream.state.cancels) == 1, within=10)
        after = await peer.call(8, "session/prompt", prompt(sid, "after"))
        assert after == {"stopReason": "end_turn"}


async def queued_behind_a_held_prompt(
    peer: Peer, fake_upstream: FakeUpstream, cwd: Path
) -> tuple[str, asyncio.Event]:
    """A session whose prompt "first" ("a") runs, held, and "second" ("b") waits behind
    it in the thread's queue."""
    await peer.call(0, "initialize", {"protocolVersion": 1})
    sid = await peer.new_session(1, cwd)
    hold = fake_upstream.state.holds[sid] = asyncio.Event()
    await peer.request("first", "session/prompt", prompt(sid, "a"))
    await wait_until(lambda: bool(fake_upstream.state.active), within=15)
    await peer.request("second", "session/prompt", prompt(sid, "b"))
    await peer.call("list", "session/list", {})  # a round trip: the second is queued
    return sid, hold


async def withdrawn_at_once(peer: Peer, fake_upstream: FakeUpstream, cwd: Path) -> None:
    """The queued prompt's cancel answers it while the first still runs, takes it off
    the queue (it never reaches the upstream) and leaves the session usable."""
    sid, hold = await queued_behind_a_held_prompt(peer, fake_upstream, cwd)
    await send(peer.ws, cancel_request("second"))
    second = await peer.answer("second")  # the first is still held
    assert second.get("result") == {"stopReason": "cancelled"}, second
    assert fake_upstream.state.active, "the running prompt is not touched"
    hold.set()
    first = await peer.answer("first")
    assert first.get("result") == {"stopReason": "end_turn"}, first
    after = await peer.call("third", "session/prompt", prompt(sid, "c"))
    assert after == {"stopReason": "end_turn"}
    sent = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
    assert [r["params"]["taskPrompt"] for r in sent] == ["a", "c"]


async def test_cancel_request_of_a_queued_prompt_answers_it_at_once(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        await withdrawn_at_once(Peer(ws), fake_upstream, tmp_path)
    assert len(bp.bridge.queues) == 0


async def test_cancel_request_of_a_queued_prompt_on_redis_frees_its_ticket(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # the clustered path: the queued prompt also holds a place in the thread's Redis
    # queue; were it kept, the third prompt would wait behind it for ever
    async with redis_server(tmp_path) as redis:
        env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_SESSION_STORE="redis", XWM_REDIS_URL=redis.url)
        bp = await start_bridge(env=env, config=config(fake_upstream, tmp_path), tmp=tmp_path)
        assert bp.bridge.cluster is not None
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(ws_url(bp), headers=AUTH) as ws,
        ):
            await withdrawn_at_once(Peer(ws), fake_upstream, tmp_path)


async def test_session_cancel_answers_a_queued_prompt_cancelled_without_running_it(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # ACP: after session/cancel every prompt of the session answers `cancelled`; the
    # queued one at once, the running one once its upstream has stopped
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        sid, hold = await queued_behind_a_held_prompt(peer, fake_upstream, tmp_path)
        await send(ws, {"method": "session/cancel", "params": {"sessionId": sid}})
        second = await peer.answer("second")
        assert second.get("result") == {"stopReason": "cancelled"}, second
        first = await peer.answer("first")
        assert first.get("result") == {"stopReason": "cancelled"}, first
        hold.set()
        after = await peer.call("third", "session/prompt", prompt(sid, "c"))
        assert after == {"stopReason": "end_turn"}
    sent = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
    assert [r["params"]["taskPrompt"] for r in sent] == ["a", "c"]


async def test_cancel_request_of_any_other_request_is_ignored(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # cancellation is optional (ACP): an unknown id, or a request other than a prompt,
    # is not cancelled; that request gets its usual answer, and $/cancel_request itself
    # (a notification) none
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        peer = Peer(ws)
        await peer.call(0, "initialize", {"protocolVersion": 1})
        await peer.request(1, "session/list", {})
        for rid in (1, 999, None, [1], {"id": 1}, True):
            await send(ws, cancel_request(rid))
        await send(ws, {"method": "$/cancel_request", "params": {}})
        listed = await peer.answer(1)
        assert "sessions" in listed["result"], listed
        sid = await peer.new_session(2, tmp_path)
        done = await peer.call(3, "session/prompt", prompt(sid, "hi"))
        assert done == {"stopReason": "end_turn"}
        await send(ws, cancel_request(3))  # no longer in flight
        assert (await peer.call(4, "session/list", {}))["sessions"]
    assert not peer.answers  # nothing but the answers asked for
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
