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
    session_params,
    sse,
    updates,
)

pytestmark = pytest.mark.asyncio


def parse_events(raw: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for block in raw.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        id_line, data_line = block.split("\n")
        assert id_line.startswith("id: ") and data_line.startswith("data: "), block
        out.append((int(id_line[4:]), orjson.loads(data_line[6:])))
    return out


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
        everything = parse_events(await resp.text())
    # the ledger holds every notification of the turn, in the order it was sent
    assert [m for _, m in everything] == sent

    async with http.get(url, headers={**AUTH, "Last-Event-ID": str(bridge_seqs[0])}) as resp:
        missed = parse_events(await resp.text())
    assert [m for _, m in missed] == sent[1:]  # everything after the first bridge update
    assert all(i >= bridge_seqs[0] for i, _ in missed)
    assert [u["seq"] for u in updates([m for _, m in missed])] == bridge_seqs[1:]

    async with http.get(url + f"?afterSeq={bridge_seqs[-1]}", headers=AUTH) as resp:
        tail = parse_events(await resp.text())
    # after the last bridge update: only the upstream frames relayed after it
    last_update = max(i for i, m in enumerate(sent) if "threadId" in m["params"])
    assert [m for _, m in tail] == sent[last_update + 1 :]


async def test_follow_streams_new_notifications_live(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    first = await sse(http, bp.rpc_url, "session.start", session_params("f1", "one"))
    url = f"{bp.url}/acp/sessions/f1/events?follow=1"
    last = updates(first)[-1]["seq"]
    received: list[tuple[int, dict[str, Any]]] = []
    async with http.get(url, headers={**AUTH, "Last-Event-ID": str(last)}) as resp:
        assert resp.status == 200
        second = await sse(
            http, bp.rpc_url, "session.message", session_params("f1", "slow:300 two")
        )
        live = [e for e in second if isinstance(e, dict) and e.get("method")]
        buf = b""
        old = [e for e in first if isinstance(e, dict) and e.get("method")]
        cut = max(i for i, m in enumerate(old) if "threadId" in m["params"])
        # catch-up part (frames relayed after update `last`) then the live turn
        expected = old[cut + 1 :] + live
        while len(received) < len(expected):
            chunk = await asyncio.wait_for(resp.content.readany(), 10)
            assert chunk, "stream ended early"
            buf += chunk
            received = parse_events(buf.decode().rsplit("\n\n", 1)[0] + "\n\n")
    assert [m for _, m in received] == expected  # same order, no gap, no duplicate
    assert updates(live)[0]["seq"] == last + 1


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
