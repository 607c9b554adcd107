"""``session.get`` while a turn ends (app/operator.py): the answer is one consistent
view, never a finished turn missing from ``turns`` (it left the journal's running
turns after the store's turns were read) with a session that says it is not running."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import FakeUpstream, StartBridge, provider_env, rpc, session_params, wait_until
from xwm_bridge.store.records import TurnRecord


async def test_a_turn_ending_between_the_reads_is_in_the_answer(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await rpc(http, bp.rpc_url, "session.start", session_params("race-1", "first"))
    hold = fake_upstream.state.holds["race-1"] = asyncio.Event()
    slow = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "session.message", session_params("race-1", "second"))
    )
    try:
        journal = bp.bridge.runner.journal
        assert journal is not None
        await wait_until(lambda: bool(journal.running("race-1")), within=10)
        ended = asyncio.Event()
        journal.observers.append(lambda _record: ended.set())
        store = bp.bridge.store
        read_turns = store.turns
        calls: list[int] = []

        async def turns_then_the_turn_ends(session_id: str, limit: int) -> list[TurnRecord]:
            got = await read_turns(session_id, limit)
            calls.append(len(got))
            if len(calls) == 1:  # the turn ends after the store's turns were read
                hold.set()
                await asyncio.wait_for(ended.wait(), 10)
            return got

        store.turns = turns_then_the_turn_ends  # type: ignore[method-assign]
        try:
            got: Any = (await rpc(http, bp.rpc_url, "session.get", {"sessionId": "race-1"}))[
                "result"
            ]
        finally:
            del store.turns  # type: ignore[method-assign]
        assert [(t["prompt"], t["status"]) for t in got["turns"]] == [
            ("first", "completed"),
            ("second", "completed"),
        ]
        session = got["session"]
        assert session["state"] == "completed" and session["running"] is False
        assert session["lastTurn"]["prompt"] == "second"
        assert session["lastTurn"]["status"] == "completed"
        assert len(calls) == 2  # read again once: the running turns changed meanwhile
    finally:
        hold.set()
        await asyncio.wait_for(slow, 10)
