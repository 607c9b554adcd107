"""``session.list`` while a turn starts or ends (app/operator.py): each row is one
consistent view. The store's page was read, then each row's running turn: a turn that
ended in between left a row with no ``lastTurn`` (neither stored when read nor running
any more), one that started left a running row with the previous turn's record."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import FakeUpstream, StartBridge, provider_env, rpc, session_params, wait_until
from xwm_bridge.store.records import SessionPage, SessionQuery


def row_of(answer: dict[str, Any], session_id: str) -> dict[str, Any]:
    (row,) = [r for r in answer["result"]["sessions"] if r["sessionId"] == session_id]
    return row


async def test_a_turn_ending_between_the_reads_is_in_its_row(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await rpc(http, bp.rpc_url, "session.start", session_params("list-end", "first"))
    hold = fake_upstream.state.holds["list-end"] = asyncio.Event()
    slow = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "session.message", session_params("list-end", "second"))
    )
    try:
        journal = bp.bridge.runner.journal
        assert journal is not None
        await wait_until(lambda: bool(journal.running("list-end")), within=10)
        ended = asyncio.Event()
        journal.observers.append(lambda _record: ended.set())
        store = bp.bridge.store
        read_page = store.list_sessions
        calls: list[int] = []

        async def page_then_the_turn_ends(query: SessionQuery) -> SessionPage:
            page = await read_page(query)
            calls.append(len(page.items))
            if len(calls) == 1:  # the turn ends after the page was read
                hold.set()
                await asyncio.wait_for(ended.wait(), 10)
            return page

        store.list_sessions = page_then_the_turn_ends  # type: ignore[method-assign]
        try:
            row = row_of(await rpc(http, bp.rpc_url, "session.list", {}), "list-end")
        finally:
            del store.list_sessions  # type: ignore[method-assign]
        assert row["state"] == "completed" and row["running"] is False
        assert row["lastTurn"] is not None and row["lastTurn"]["prompt"] == "second"
        assert row["lastTurn"]["status"] == "completed"
        assert row["lastTurn"]["turnId"] == row["lastTurnId"]
        assert len(calls) == 2  # read again once: the running turns changed meanwhile
    finally:
        hold.set()
        await asyncio.wait_for(slow, 10)


async def test_a_turn_starting_between_the_reads_is_in_its_row(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    await rpc(http, bp.rpc_url, "session.start", session_params("list-start", "first"))
    await rpc(http, bp.rpc_url, "session.start", session_params("list-idle", "other"))
    hold = fake_upstream.state.holds["list-start"] = asyncio.Event()
    journal = bp.bridge.runner.journal
    assert journal is not None
    store = bp.bridge.store
    read_page = store.list_sessions
    calls: list[int] = []
    slow: list[asyncio.Future[Any]] = []

    async def page_then_a_turn_starts(query: SessionQuery) -> SessionPage:
        page = await read_page(query)
        calls.append(len(page.items))
        if len(calls) == 1:  # a turn starts after the page was read
            message = session_params("list-start", "second")
            slow.append(asyncio.ensure_future(rpc(http, bp.rpc_url, "session.message", message)))
            await wait_until(lambda: bool(journal.running("list-start")), within=10)
        return page

    store.list_sessions = page_then_a_turn_starts  # type: ignore[method-assign]
    try:
        answer = await rpc(http, bp.rpc_url, "session.list", {})
    finally:
        del store.list_sessions  # type: ignore[method-assign]
    try:
        row = row_of(answer, "list-start")
        assert row["state"] == "running" and row["running"] is True
        assert row["lastTurn"]["prompt"] == "second" and row["lastTurn"]["status"] == "running"
        assert row["lastTurn"]["turnId"] == row["lastTurnId"]
        assert row_of(answer, "list-idle")["state"] == "completed"
        assert len(calls) == 2
    finally:
        hold.set()
        await asyncio.wait_for(asyncio.gather(*slow), 10)


async def test_a_quiet_page_is_read_once(
    start_bridge: StartBridge, http: aiohttp.ClientSession, fake_upstream: FakeUpstream
) -> None:
    """The common case costs one read, however many sessions the page holds, and a
    turn running all along (no start or end meanwhile) does not make it read again."""
    bp = await start_bridge(env=provider_env(fake_upstream.url))
    for n in range(5):
        await rpc(http, bp.rpc_url, "session.start", session_params(f"quiet-{n}", "hi"))
    hold = fake_upstream.state.holds["quiet-0"] = asyncio.Event()
    slow = asyncio.ensure_future(
        rpc(http, bp.rpc_url, "session.message", session_params("quiet-0", "held"))
    )
    try:
        journal = bp.bridge.runner.journal
        assert journal is not None
        await wait_until(lambda: bool(journal.running("quiet-0")), within=10)
        store = bp.bridge.store
        counted: list[str] = []
        for name in ("list_sessions", "load", "turns"):
            real = getattr(store, name)

            def counting(*args: Any, _real: Any = real, _name: str = name) -> Any:
                counted.append(_name)
                return _real(*args)

            setattr(store, name, counting)
        try:
            answer = await rpc(http, bp.rpc_url, "session.list", {})
        finally:
            for name in ("list_sessions", "load", "turns"):
                delattr(store, name)
        assert len(answer["result"]["sessions"]) == 5
        assert row_of(answer, "quiet-0")["state"] == "running"
        assert counted == ["list_sessions"]
    finally:
        hold.set()
        await asyncio.wait_for(slow, 10)
