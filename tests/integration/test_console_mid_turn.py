"""A console that arrives mid-turn loses nothing (issue 13, "reload the page mid-turn").

What the page does on a reload, over ``/console/ws``, with each gap forced open:
``session.list`` (its ``watchCursor``), then ``session.get`` + ``session.replay`` (the
output so far), then ``bridge.watch since=<cursor>``. Updates streamed between the cursor
and the snapshot come twice (in the replay and in the watch's catch-up); updates streamed
after the snapshot come only in the watch. A second watcher on ``/acp`` tells the test
when the turn has moved on, so every interleaving is forced, not waited for by time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.conftest import AUTH, TOKEN, MakeUpstream, StartBridge, provider_env, rpc
from tests.conftest import session_params as turn_params
from tests.integration.test_websocket import recv, req

SID = "mid-1"
Event = dict[str, Any]
Match = Callable[[Event], bool]


class Console:
    """The page's side of ``/console/ws``: requests, and the watch's notifications apart."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[Event] = []
        self._next = 1

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        rid = self._next = self._next + 1
        await self.ws.send_str(req(method, params, rid=rid))
        while True:
            msg = await recv(self.ws)
            if msg.get("method") == "bridge.event":
                self.events.append(msg["params"])
            elif msg.get("id") == rid:
                return msg

    async def watch(self, since: str) -> None:
        await self.ws.send_str(req("bridge.watch", {"since": since}, rid="watch"))

    async def until(self, done: Match) -> None:
        while not any(done(e) for e in self.events):
            msg = await recv(self.ws)
            if msg.get("method") == "bridge.event":
                self.events.append(msg["params"])


async def observed(ws: aiohttp.ClientWebSocketResponse, seen: list[Event], ok: Match) -> None:
    """Read the observer's watch until an update matching ``ok`` has been published."""
    while not any(e.get("type") == "update" and ok(e) for e in seen):
        seen.append((await recv(ws))["params"])


def seq_of(cursor: str) -> int:
    return int(cursor.rpartition(":")[2])


async def test_snapshot_and_watch_merge_by_event_id(
    start_bridge: StartBridge, http: aiohttp.ClientSession, make_fake_upstream: MakeUpstream
) -> None:
    upstream = await make_fake_upstream(chunks=8)
    bp = await start_bridge(env=provider_env(upstream.url))
    said = "nothing streamed before the page subscribed is lost"
    prompt = f"drip:150 {said}"
    async with (
        http.ws_connect(bp.ws_url, headers=AUTH) as observer,
        http.ws_connect(f"{bp.url}/console/ws") as page,
    ):
        await observer.send_str(req("bridge.watch", {"kinds": ["turn"], "sessionId": SID}, "o"))
        assert (await recv(observer))["params"]["type"] == "live"
        await page.send_str(req("console.auth", {"token": TOKEN}, rid=0))
        assert (await recv(page))["result"]["authenticated"] is True
        console = Console(page)
        seen: list[Event] = []
        start = rpc(http, bp.rpc_url, "session.start", turn_params(SID, prompt))
        turn = asyncio.ensure_future(start)
        try:
            await observed(observer, seen, lambda e: True)  # mid-turn
            cursor = (await console.call("session.list", {}))["result"]["watchCursor"]
            # an update after the cursor and before the snapshot: it will come twice
            await observed(observer, seen, lambda e: e["seq"] > seq_of(cursor))
            got = (await console.call("session.get", {"sessionId": SID}))["result"]
            replay = (await console.call("session.replay", {"sessionId": SID}))["result"]
            assert [t["status"] for t in got["turns"]] == ["running"]
            last_replayed = max(replay["eventIds"])
            # an update after the snapshot: only the watch has it
            await observed(observer, seen, lambda e: e["eventId"] > last_replayed)
            await console.watch(cursor)
            await console.until(lambda e: e.get("type") == "finished")
            result = (await asyncio.wait_for(turn, 30))["result"]
        finally:
            turn.cancel()

    updates = [e for e in console.events if e.get("type") == "update"]
    ids = [e["eventId"] for e in updates]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    overlap = [e for e in updates if e["eventId"] <= last_replayed]
    assert overlap, "the watch's catch-up repeats what the replay already had"
    assert all(e["eventId"] in replay["eventIds"] for e in overlap)
    # and what came before session.get's cursor is in its snapshot
    upto = seq_of(got["watchCursor"])
    assert all(e["eventId"] in replay["eventIds"] for e in updates if e["seq"] <= upto)
    # the merge the page does: the replay, then the watch's updates it does not have
    text = "".join(
        n["params"].get("delta", "")
        for n in replay["notifications"]
        if n["params"].get("type") == "delta"
    )
    text += "".join(
        (e["update"] or {}).get("delta", "")
        for e in updates
        if e["eventId"] > last_replayed and (e["update"] or {}).get("type") == "delta"
    )
    assert text == result["output"] == f"echo: {said}"
    # nothing in between was skipped: the replay and the watch together hold every entry
    assert set(replay["eventIds"]) | set(ids) == set(range(1, max(ids) + 1))
