"""One suite, every store: the behaviour sessions rely on to survive restarts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import redis_server
from xwm_bridge.store.base import (
    INTERRUPTED,
    RUNNING,
    LedgerEntry,
    MemoryStore,
    SessionQuery,
    SessionRecord,
    SessionStore,
    StoreLimits,
    emitted_pos,
    relayed_pos,
)
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.store.sqlite import SQLiteStore

pytestmark = pytest.mark.asyncio

Factory = Callable[[StoreLimits], Awaitable[SessionStore]]


def update(sid: str, seq: int, turn: str = "turn-1") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session.update",
        "params": {"sessionId": sid, "seq": seq, "turnId": turn},
    }


async def messages(
    store: SessionStore, session_id: str, after: int, limit: int
) -> list[dict[str, Any]]:
    return [m for _, m in await store.replay(session_id, after, limit)]


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Factory]:
    opened: list[SessionStore] = []
    async with contextlib.AsyncExitStack() as stack:
        server = (
            await stack.enter_async_context(redis_server(tmp_path))
            if request.param == "redis"
            else None
        )

        async def make(limits: StoreLimits) -> SessionStore:
            store: SessionStore
            if request.param == "memory":
                store = MemoryStore(limits)
            elif server is not None:
                store = RedisStore(server.url, limits, prefix=f"t{len(opened)}:")
            else:
                store = SQLiteStore(tmp_path / "state" / "sessions.db", limits)
            await store.start()
            opened.append(store)
            return store

        yield make
        for store in opened:
            await store.close()


async def test_record_round_trip(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    assert await store.load("s1") is None
    record = SessionRecord(
        "s1",
        "t1",
        provider="codex",
        history=("a", "b"),
        seq=4,
        last_turn_id="turn-9",
        last_turn_status="completed",
        upstream=(("acpSessionId", "x-1"),),
    )
    store.save(record)
    loaded = await store.load("s1")
    assert loaded is not None
    assert loaded.thread_id == "t1" and loaded.provider == "codex"
    assert loaded.history == ("a", "b") and loaded.seq == 4
    assert loaded.last_turn_id == "turn-9" and loaded.last_turn_status == "completed"
    assert dict(loaded.upstream) == {"acpSessionId": "x-1"}


async def test_replay_after_seq_includes_relayed_frames(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1", seq=0))
    store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", update("s1", 1)))
    store.append("s1", LedgerEntry(relayed_pos(1), "turn-1", {"method": "upstream", "n": 1}))
    store.append("s1", LedgerEntry(emitted_pos(2), "turn-1", update("s1", 2)))
    store.append("s1", LedgerEntry(relayed_pos(2), "turn-1", {"method": "upstream", "n": 2}))
    everything = await messages(store, "s1", 0, 100)
    assert [m.get("params", m).get("seq", m.get("n")) for m in everything] == [1, 1, 2, 2]
    after_one = await messages(store, "s1", 1, 100)
    assert after_one == everything[1:]
    assert await messages(store, "s1", 2, 100) == everything[3:]
    assert await messages(store, "s1", 0, 2) == everything[:2]
    assert await messages(store, "other", 0, 100) == []
    # the loaded seq never lags the ledger (a crash may leave the record behind)
    loaded = await store.load("s1")
    assert loaded is not None and loaded.seq == 2


async def test_ledger_is_bounded_by_entries_and_age(make_store: Factory) -> None:
    store = await make_store(StoreLimits(ledger_max_entries=5, ledger_max_age=60))
    store.save(SessionRecord("s1", "t1"))
    for seq in range(1, 13):
        store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
    kept = await messages(store, "s1", 0, 100)
    assert [m["params"]["seq"] for m in kept] == [8, 9, 10, 11, 12]
    old = time.time() - 120
    store.save(SessionRecord("s2", "t2"))
    store.append("s2", LedgerEntry(emitted_pos(1), "turn-1", update("s2", 1), ts=old))
    store.append("s2", LedgerEntry(emitted_pos(2), "turn-1", update("s2", 2)))
    assert [m["params"]["seq"] for m in await messages(store, "s2", 0, 100)] == [2]
    await store.prune()
    assert [m["params"]["seq"] for m in await messages(store, "s2", 0, 100)] == [2]


async def test_list_sessions_filters_and_pages_newest_first(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    now = time.time()
    for i in range(7):
        cwd = "/work/a" if i % 2 == 0 else "/work/b"
        store.save(
            SessionRecord(f"s{i}", f"s{i}", upstream=(("acp.cwd", cwd),), updated_at=now + i)
        )
    store.save(SessionRecord("plain", "plain", updated_at=now + 100))  # not an ACP session
    # the same instant: ties are broken by session id, descending
    store.save(SessionRecord("t1", "t1", upstream=(("acp.cwd", "/work/a"),), updated_at=now + 50))
    store.save(SessionRecord("t2", "t2", upstream=(("acp.cwd", "/work/a"),), updated_at=now + 50))
    store.append("ledger-only", LedgerEntry(emitted_pos(1), "turn-1", update("ledger-only", 1)))

    every = await store.list_sessions(SessionQuery(limit=100))
    assert [r.session_id for r in every] == [
        "plain",
        "t2",
        "t1",
        "s6",
        "s5",
        "s4",
        "s3",
        "s2",
        "s1",
        "s0",
    ]
    acp = await store.list_sessions(SessionQuery(limit=100, upstream=(("acp.cwd", None),)))
    assert "plain" not in {r.session_id for r in acp} and len(acp) == 9

    where: tuple[tuple[str, str | None], ...] = (("acp.cwd", "/work/a"),)
    query = SessionQuery(limit=2, upstream=where)
    pages: list[list[str]] = []
    while True:
        page = await store.list_sessions(query)
        if not page:
            break
        pages.append([r.session_id for r in page])
        last = page[-1]
        query = SessionQuery(2, where, (last.updated_at, last.session_id))
    assert pages == [["t2", "t1"], ["s6", "s4"], ["s2", "s0"]]
    found = await store.list_sessions(SessionQuery(limit=1, upstream=(("acp.cwd", "/nope"),)))
    assert found == []
    # the records come back whole
    (first,) = await store.list_sessions(SessionQuery(limit=1, upstream=(("acp.cwd", None),)))
    assert first.session_id == "t2" and dict(first.upstream) == {"acp.cwd": "/work/a"}
    # several keys: all must match
    store.save(
        SessionRecord(
            "owned", "owned", upstream=(("acp.cwd", "/work/a"), ("acp.owner", "p1")), updated_at=now
        )
    )
    both = (("acp.cwd", "/work/a"), ("acp.owner", "p1"))
    mine = await store.list_sessions(SessionQuery(limit=10, upstream=both))
    assert [r.session_id for r in mine] == ["owned"]


async def test_delete_drops_record_and_ledger(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1", seq=1))
    store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", update("s1", 1)))
    store.delete("s1")
    assert await store.load("s1") is None
    assert await messages(store, "s1", 0, 100) == []


async def test_recover_marks_running_turns_interrupted(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1", seq=1, last_turn_id="turn-7", last_turn_status=RUNNING))
    store.append("s1", LedgerEntry(emitted_pos(3), "turn-7", update("s1", 3, "turn-7")))
    store.save(
        SessionRecord("s2", "t2", seq=2, last_turn_id="turn-8", last_turn_status="completed")
    )
    assert await store.recover() == ["s1"]
    loaded = await store.load("s1")
    assert loaded is not None
    assert loaded.last_turn_status == INTERRUPTED and loaded.seq == 4
    last = (await messages(store, "s1", 3, 10))[-1]["params"]
    assert last["seq"] == 4 and last["turnId"] == "turn-7"
    assert last["interrupted"] is True and last["error"] is True and last["pending"] is False
    untouched = await store.load("s2")
    assert untouched is not None and untouched.last_turn_status == "completed"
    assert await store.recover() == []


async def test_retention_prunes_untouched_sessions(make_store: Factory) -> None:
    store = await make_store(StoreLimits(retention=60))
    store.save(SessionRecord("old", "t", updated_at=time.time() - 120))
    store.save(SessionRecord("new", "t"))
    pruned = await store.prune()
    assert pruned == (0 if store.name == "redis" else 1)  # Redis: key expiry does it
    assert await store.load("old") is None
    assert await store.load("new") is not None


async def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    first = SQLiteStore(path)
    await first.start()
    first.save(SessionRecord("s1", "t1", provider="gemini", history=("hi",), seq=2))
    first.append("s1", LedgerEntry(emitted_pos(2), "turn-1", update("s1", 2)))
    await first.close()
    second = SQLiteStore(path)
    await second.start()
    try:
        loaded = await second.load("s1")
        assert loaded is not None and loaded.provider == "gemini" and loaded.history == ("hi",)
        assert len(await messages(second, "s1", 0, 10)) == 1
        mode = await second._call(lambda db: db.execute("PRAGMA journal_mode").fetchone()[0])
        assert mode == "wal"
    finally:
        await second.close()


async def test_sqlite_writes_do_not_block_the_loop(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        started = time.perf_counter()
        for seq in range(1, 5001):
            store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
        queued = time.perf_counter() - started
        assert queued < 0.5  # a queue put each, no disk I/O on the loop
        assert len(await messages(store, "s1", 4990, 100)) == 10
    finally:
        await store.close()
