"""``GET /acp/sessions/{id}/events``: SSE catch-up with Last-Event-ID (issue 6)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    AUTH,
    FakeUpstream,
    StartBridge,
    provider_env,
    rpc,
    session_params,
    sse,
    updates,
    wait_until,
)
from xwm_bridge.store.base import StoreUnavailable

pytestmark = pytest.mark.asyncio


def parse_all(raw: str) -> list[tuple[str, int, dict[str, Any]]]:
    """Every event as (event type, id, data); comments skipped."""
    out = []
    for block in raw.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append(
            (fields.get("event", "message"), int(fields["id"]), orjson.loads(fields["data"]))
        )
    return out


def notes(events: list[tuple[str, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [m for kind, _, m in events if kind == "message"]


async def test_last_event_id_returns_what_was_missed(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    events = await sse(http, bp.rpc_url, "session.start", session_params("c1", "hello"))
    events += await sse(http, bp.rpc_url, "session.message", session_params("c1", "again"))
    sent = [e for e in events if isinstance(e, dict) and e.get("method")]
    bridge_seqs = [u["seq"] for u in updates(events)]
    assert bridge_seqs == [1, 2] and len(sent) > 2  # relayed upstream frames too
    url = f"{bp.url}/acp/sessions/c1/events"

    async with http.get(url, headers=AUTH) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        everything = parse_all(await resp.text())
    # the ledger holds every notification of the turn, in the order it was sent
    assert notes(everything) == sent

    first_id = everything[0][1]
    async with http.get(url, headers={**AUTH, "Last-Event-ID": str(first_id)}) as resp:
        missed = parse_all(await resp.text())
    assert missed == everything[1:]  # everything after the first event
    assert [u["seq"] for u in updates(notes(missed))] == bridge_seqs[1:]

    async with http.get(url + f"?afterSeq={bridge_seqs[-1]}", headers=AUTH) as resp:
        tail = parse_all(await resp.text())
    # after the last bridge update: only the upstream frames relayed after it, and the result
    last_update = max(i for i, m in enumerate(sent) if "threadId" in m["params"])
    assert notes(tail) == sent[last_update + 1 :]
    assert [k for k, _, _ in tail][-1] == "result"


async def test_follow_streams_new_notifications_live(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await sse(http, bp.rpc_url, "session.start", session_params("f1", "one"))
    url = f"{bp.url}/acp/sessions/f1/events"
    async with http.get(url, headers=AUTH) as resp:
        old = parse_all(await resp.text())
    last = old[-1][1]
    received: list[tuple[str, int, dict[str, Any]]] = []
    async with http.get(url + "?follow=1", headers={**AUTH, "Last-Event-ID": str(last)}) as resp:
        assert resp.status == 200
        second = await sse(
            http, bp.rpc_url, "session.message", session_params("f1", "slow:300 two")
        )
        live = [e for e in second if isinstance(e, dict) and e.get("method")]
        buf = b""
        # the live turn's notifications, then its result
        while len(received) < len(live) + 1:
            chunk = await asyncio.wait_for(resp.content.readany(), 10)
            assert chunk, "stream ended early"
            buf += chunk
            received = parse_all(buf.decode().rsplit("\n\n", 1)[0] + "\n\n")
    assert notes(received) == live  # same order, no gap, no duplicate
    assert [i for _, i, _ in received] == list(range(last + 1, last + 1 + len(live) + 1))
    assert received[-1][0] == "result" and received[-1][2]["result"] == second[-1]["result"]


async def test_catchup_stream_checks_auth_and_params(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    url = f"{bp.url}/acp/sessions/x/events"
    async with http.get(url) as resp:
        assert resp.status == 401
    async with http.get(url, headers={**AUTH, "Last-Event-ID": "abc"}) as resp:
        assert resp.status == 400
        body = await resp.json()
        assert body["error"]["code"] == -32602
    async with http.post(url, headers=AUTH) as resp:
        assert resp.status == 405
    async with http.get(url, headers=AUTH) as resp:  # unknown session: empty stream
        assert resp.status == 200 and await resp.text() == ""


async def test_every_event_has_a_distinct_increasing_id_and_resumes_exactly(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """Issue 15 item 2: ids 1, 2, 3, … (relayed frames included), so Last-Event-ID
    resumes from any event with no loss and no duplicate."""
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await sse(http, bp.rpc_url, "session.start", session_params("ids", "hello"))
    await sse(http, bp.rpc_url, "session.message", session_params("ids", "again"))
    url = f"{bp.url}/acp/sessions/ids/events"
    async with http.get(url, headers=AUTH) as resp:
        everything = parse_all(await resp.text())
    ids = [i for _, i, _ in everything]
    assert ids == list(range(1, len(ids) + 1)), ids
    # each turn's final result is an event of its own, after the turn's notifications
    kinds = [k for k, _, _ in everything]
    assert kinds.count("result") == 2 and kinds[-1] == "result"
    assert everything[-1][2]["result"]["output"] == "echo: again"
    for cut in range(len(ids)):
        async with http.get(url, headers={**AUTH, "Last-Event-ID": str(ids[cut])}) as resp:
            rest = parse_all(await resp.text())
        assert rest == everything[cut + 1 :], cut


async def test_replay_accepts_the_event_id_and_returns_turn_results(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    first = await sse(http, bp.rpc_url, "session.start", session_params("rp", "one"))
    await sse(http, bp.rpc_url, "session.message", session_params("rp", "two"))
    url = f"{bp.url}/acp/sessions/rp/events"
    async with http.get(url, headers=AUTH) as resp:
        everything = parse_all(await resp.text())
    first_result = next(i for k, i, _ in everything if k == "result")
    reply = await rpc(
        http, bp.rpc_url, "session.replay", {"sessionId": "rp", "afterEventId": first_result}
    )
    got = reply["result"]
    rest = everything[[i for _, i, _ in everything].index(first_result) + 1 :]
    notes = [(i, m) for k, i, m in rest if k == "message"]
    assert got["notifications"] == [m for _, m in notes]
    assert got["eventIds"] == [i for i, _ in notes]
    assert [r["result"]["output"] for r in got["results"]] == ["echo: two"]
    assert got["results"][0]["eventId"] == everything[-1][1]
    assert got["lastEventId"] == everything[-1][1]
    whole = await rpc(http, bp.rpc_url, "session.replay", {"sessionId": "rp"})
    assert [r["result"]["output"] for r in whole["result"]["results"]] == ["echo: one", "echo: two"]
    assert first[-1]["result"] == whole["result"]["results"][0]["result"]
    bad = await rpc(http, bp.rpc_url, "session.replay", {"sessionId": "rp", "afterEventId": -1})
    assert bad["error"]["code"] == -32602


async def test_following_a_session_another_principal_then_creates_ends_the_stream(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """An unknown session is anyone's when the stream opens; one that another client
    token then creates (session ids are the client's: easy to guess) is not: the follower
    gets none of its events, the stream ends."""
    other = {"Authorization": "Bearer other-client-token-77"}
    bp = await start_bridge(
        env=provider_env(fake_upstream.url, XWM_CLIENT_TOKENS="other-client-token-77")
    )
    url = f"{bp.url}/acp/sessions/guessable/events?follow=1"
    async with http.get(url, headers=other) as resp:
        assert resp.status == 200
        await sse(http, bp.rpc_url, "session.start", session_params("guessable", "private"))
        leaked = await asyncio.wait_for(resp.content.read(), 10)  # ends: EOF
    assert [e for e in parse_all(leaked.decode())] == []
    async with http.get(url, headers=other) as resp:  # and now it is refused at once
        assert resp.status == 403


async def test_a_store_that_cannot_answer_is_a_503_not_a_traceback(
    start_bridge: StartBridge, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    bp = await start_bridge()
    store = bp.bridge.sessions.store

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("session store: Redis at 10.0.0.5:6379 did not answer within 3s")

    monkeypatch.setattr(store, "replay", down)
    monkeypatch.setattr(store, "load", down)
    async with http.get(f"{bp.url}/acp/sessions/s1/events", headers=AUTH) as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["error"]["message"] == "session store unavailable"
    # the methods that read the store say the same (-32603, with that message)
    replay = await rpc(http, bp.rpc_url, "session.replay", {"sessionId": "s1"})
    assert replay["error"] == {"code": -32603, "message": "session store unavailable"}
    logs = "\n".join(bp.logs)
    assert "10.0.0.5:6379" in logs and "Traceback" not in logs


async def test_follow_streams_end_cleanly_on_shutdown_after_the_drain(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """A turn that finishes during the drain reaches its follower whole (every
    notification, then the result: the stream ended after the first entry it read
    once the drain began); then every follow stream ends (its chunked body completed),
    an idle one too: that one waited for aiohttp's shutdown timeout, which cut it and
    held the shutdown up for 10 s."""
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    release = fake_upstream.state.holds["d1"] = asyncio.Event()
    turn = asyncio.ensure_future(
        sse(http, bp.rpc_url, "session.start", session_params("d1", "late"))
    )
    await wait_until(lambda: "d1" in fake_upstream.state.active)
    base = f"{bp.url}/acp/sessions"
    async with (
        http.get(f"{base}/d1/events?follow=1", headers=AUTH) as busy,
        http.get(f"{base}/idle/events?follow=1", headers=AUTH) as idle,
    ):
        assert busy.status == idle.status == 200
        await wait_until(lambda: len(bp.bridge.sessions.feed) == 2)
        stopping = asyncio.ensure_future(bp.stop())
        await wait_until(lambda: bp.bridge.supervisor.closing)  # draining: turn still running
        release.set()
        # a cut body raises ClientPayloadError
        busy_body, idle_body = await asyncio.wait_for(asyncio.gather(busy.read(), idle.read()), 20)
    streamed = await turn
    sent = [e for e in streamed if isinstance(e, dict) and e.get("method")]
    assert len(sent) > 2  # started, the upstream's chunks, …: several entries in the drain
    events = parse_all(busy_body.decode())
    assert notes(events) == sent  # every one, in order
    assert events[-1][0] == "result" and events[-1][2]["result"] == streamed[-1]["result"]
    assert parse_all(idle_body.decode()) == []
    await asyncio.wait_for(stopping, 20)
