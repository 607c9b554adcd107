"""One suite, every store: the behaviour sessions rely on to survive restarts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.nesting import nested
from tests.redis_server import redis_server
from xwm_bridge.core.sessions import Session
from xwm_bridge.store import redis_writer
from xwm_bridge.store.base import (
    INTERRUPTED,
    NOTIFICATION,
    RESULT,
    RUNNING,
    LedgerEntry,
    SessionRecord,
    SessionStore,
    StoreLimits,
    StoreUnavailable,
    emitted_pos,
    relayed_pos,
)
from xwm_bridge.store.memory import MemoryStore
from xwm_bridge.store.records import SessionQuery
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.store.sqlite import SQLiteStore
from xwm_bridge.store.sqlite_schema import SCHEMA_VERSION
from xwm_bridge.tasks import wait_for

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
    return [e.message for e in await store.replay(session_id, after, limit)]


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

    async def records(query: SessionQuery) -> list[SessionRecord]:
        return [r for r, _ in (await store.list_sessions(query)).items]

    every = await records(SessionQuery(limit=100))
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
    acp = await records(SessionQuery(limit=100, upstream=(("acp.cwd", None),)))
    assert "plain" not in {r.session_id for r in acp} and len(acp) == 9

    where: tuple[tuple[str, str | None], ...] = (("acp.cwd", "/work/a"),)
    query = SessionQuery(limit=2, upstream=where)
    pages: list[list[str]] = []
    while True:
        page = await store.list_sessions(query)
        pages.append([r.session_id for r, _ in page.items])
        if page.next_after is None:
            break
        query = SessionQuery(limit=2, upstream=where, after=page.next_after)
    assert [p for p in pages if p] == [["t2", "t1"], ["s6", "s4"], ["s2", "s0"]]
    found = await records(SessionQuery(limit=1, upstream=(("acp.cwd", "/nope"),)))
    assert found == []
    # the records come back whole
    (first,) = await records(SessionQuery(limit=1, upstream=(("acp.cwd", None),)))
    assert first.session_id == "t2" and dict(first.upstream) == {"acp.cwd": "/work/a"}
    # several keys: all must match
    store.save(
        SessionRecord(
            "owned", "owned", upstream=(("acp.cwd", "/work/a"), ("acp.owner", "p1")), updated_at=now
        )
    )
    both = (("acp.cwd", "/work/a"), ("acp.owner", "p1"))
    mine = await records(SessionQuery(limit=10, upstream=both))
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


async def test_recover_writes_the_interrupted_turns_record(make_store: Factory) -> None:
    """A running turn's record is written when it ends; one that died with the process
    gets its record from recover: the stored one marked interrupted, or a new one."""
    from xwm_bridge.store.records import TurnRecord

    store = await make_store(StoreLimits())
    store.save(
        SessionRecord(
            "s1", "t1", provider="codex", history=("first", "long job"), seq=1,
            last_turn_id="turn-2", last_turn_status=RUNNING, updated_at=time.time() - 5,
        )
    )  # fmt: skip
    store.save_turn(TurnRecord("s1", "turn-1", status="completed", started_at=1.0))
    store.save(SessionRecord("s2", "t2", seq=1, last_turn_id="turn-9", last_turn_status=RUNNING))
    store.save_turn(TurnRecord("s2", "turn-9", prompt="kept", started_at=2.0))  # written early
    assert sorted(await store.recover()) == ["s1", "s2"]
    *_, made = await store.turns("s1", 10)
    assert (made.turn_id, made.status, made.prompt, made.provider) == (
        "turn-2",
        INTERRUPTED,
        "long job",
        "codex",
    )
    assert made.finished_at >= made.started_at > 0 and "interrupted" in made.error
    (kept,) = await store.turns("s2", 10)
    assert (kept.status, kept.prompt, kept.started_at) == (INTERRUPTED, "kept", 2.0)


async def test_retention_prunes_untouched_sessions(make_store: Factory) -> None:
    store = await make_store(StoreLimits(retention=60))
    store.save(SessionRecord("old", "t", updated_at=time.time() - 120))
    store.save(SessionRecord("new", "t"))
    pruned = await store.prune()
    assert pruned == (0 if store.name == "redis" else 1)  # Redis: key expiry does it
    assert await store.load("old") is None
    assert await store.load("new") is not None


async def test_retention_keeps_a_session_whose_turn_is_still_running(
    make_store: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn can outlast ``retention`` (its session is saved when it starts and when
    it ends): a running session is not pruned (Redis: its record does not expire and
    stays in the index), or its record, history and the ledger written so far would go
    mid-turn."""
    from xwm_bridge.store import redis as redis_store

    monkeypatch.setattr(redis_store, "TRIM_INDEX_BATCH", 2)  # batches past kept entries
    store = await make_store(StoreLimits(retention=60))
    old = time.time() - 120
    for i, sid in enumerate(("long", "long-2", "long-3")):
        store.save(
            SessionRecord(
                sid, "t", history=("go",), last_turn_id="turn-1",
                last_turn_status=RUNNING, updated_at=old + i,
            )
        )  # fmt: skip
    store.append("long", LedgerEntry(emitted_pos(1), "turn-1", update("long", 1)))
    for i in range(3):
        store.save(SessionRecord(f"idle-{i}", "t", updated_at=old + 3 + i))
    assert await store.prune() == (0 if store.name == "redis" else 3)
    kept = await store.load("long")
    assert kept is not None and kept.history == ("go",)
    assert len(await messages(store, "long", 0, 10)) == 1
    assert await store.load("idle-0") is None
    listed = [r.session_id for r, _ in (await store.list_sessions(SessionQuery())).items]
    assert listed == ["long-3", "long-2", "long"]
    store.save(replace(kept, last_turn_status="completed"))  # the turn ended: retention again
    await store.prune()
    assert await store.load("long") is None


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
    applied_on: set[int] = set()
    apply = store._apply

    def recorded(db: Any, writes: Any) -> None:
        applied_on.add(threading.get_ident())
        apply(db, writes)

    store._apply = recorded  # type: ignore[method-assign]
    await store.start()
    try:
        # the loop thread's own CPU, not the wall clock: on a loaded machine the store
        # thread (and other processes) take the GIL and cores, which is not the loop's work
        started = time.thread_time()
        for seq in range(1, 5001):
            store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
        queued = time.thread_time() - started
        assert queued < 0.5  # a queue put each, no disk I/O on the loop
        assert len(await messages(store, "s1", 4990, 100)) == 10
        assert applied_on and threading.get_ident() not in applied_on  # the store thread's
    finally:
        await store.close()


# --- a hostile peer's record (issue 16 item 1) ---------------------------------------


async def test_a_poisoned_record_is_dropped_and_later_writes_persist(make_store: Factory) -> None:
    """A notification nested 300 levels (orjson writes at most 254) used to end the
    SQLite writer thread: every later write was lost and every read waited 30 s."""
    store = await make_store(StoreLimits())
    store.save(SessionRecord("before", "t"))
    store.append("poisoned", LedgerEntry(emitted_pos(1), "turn-1", {"deep": nested(300)}))
    store.append("poisoned", LedgerEntry(emitted_pos(2), "turn-1", update("poisoned", 2)))
    store.save(SessionRecord("after", "t", history=("later",), seq=3))
    store.append("after", LedgerEntry(emitted_pos(3), "turn-1", update("after", 3)))

    async with asyncio.timeout(5):  # not READ_TIMEOUT: the writer is still there
        assert await store.load("before") is not None
        after = await store.load("after")
        assert after is not None and after.history == ("later",)
        assert [m["params"]["seq"] for m in await messages(store, "after", 0, 10)] == [3]
        # the one bad entry is gone, its neighbour stays
        assert [m["params"]["seq"] for m in await messages(store, "poisoned", 0, 10)] == [2]
        health = await store.health()
    assert store.counters.bad_records == 1
    assert health.ok and store.alive()
    store.save(SessionRecord("much-later", "t"))
    assert await store.load("much-later") is not None


async def test_a_bad_record_in_a_batch_does_not_lose_the_batch(tmp_path: Path) -> None:
    """SQLite refuses an integer past 2^63: only that write is dropped."""
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        for i in range(50):
            store.save(SessionRecord(f"s{i}", "t", seq=2**70 if i == 25 else i))
        loaded = [await store.load(f"s{i}") for i in range(50)]
        assert [r is not None for r in loaded].count(False) == 1 and loaded[25] is None
        assert store.counters.bad_records == 1
    finally:
        await store.close()


async def test_sqlite_health_names_the_failed_check(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        health = await store.health()
        assert (health.backend, health.check, health.ok) == ("sqlite", "writable", True)
        await store._call(lambda db: db.execute("PRAGMA query_only = ON"))  # read-only now
        broken = await store.health()
        assert (broken.check, broken.ok) == ("writable", False)
        assert "sessions.db" in broken.error
        await store._call(lambda db: db.execute("PRAGMA query_only = OFF"))
        assert (await store.health()).ok
    finally:
        await store.close()


async def test_sqlite_recover_that_fails_midway_leaves_nothing_half_done(tmp_path: Path) -> None:
    """Recovery of a running turn is one transaction: a disk that fills up while the
    turn record is written (after the session row and the ledger entry) leaves the
    turn still ``running``, and the next start interrupts it completely; the record
    was marked interrupted alone before, so no later recover came back to its turn."""

    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        store.save(
            SessionRecord(
                "s1", "t1", history=("\u00e9" * 4000,), seq=1,
                last_turn_id="turn-2", last_turn_status=RUNNING,
            )
        )  # fmt: skip
        assert await store.load("s1") is not None
        # the disk is full: the turn record's body (its 8000-byte prompt) needs new pages
        pages = await store._call(lambda db: db.execute("PRAGMA page_count").fetchone()[0])
        await store._call(lambda db: db.execute(f"PRAGMA max_page_count = {pages}"))
        with pytest.raises(StoreUnavailable, match="full"):  # sqlite3.OperationalError
            await store.recover()
        await store._call(lambda db: db.execute("PRAGMA max_page_count = 1073741823"))
        loaded = await store.load("s1")
        assert loaded is not None and loaded.last_turn_status == RUNNING
        assert await store.recover() == ["s1"]
        (turn,) = await store.turns("s1", 10)
        assert (turn.turn_id, turn.status) == ("turn-2", INTERRUPTED)
        (entry,) = await store.replay("s1", 0, 10)
        assert entry.message["params"]["interrupted"] is True
    finally:
        await store.close()


async def test_a_dead_store_thread_is_started_again(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        store._ops.put(("stop",))  # the thread ends as if it had crashed
        assert store._thread is not None
        await asyncio.to_thread(store._thread.join, 5)
        assert not store.alive()
        store.save(SessionRecord("queued-while-dead", "t"))
        health = await store.health()  # finds it dead, restarts it, probes it
        assert health.ok and store.alive() and store.counters.restarts == 1
        assert await store.load("queued-while-dead") is not None
    finally:
        await store.close()


async def test_redis_health_names_the_failed_check(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=0.5)
        await store.start()
        try:
            health = await store.health()
            assert (health.backend, health.check, health.ok) == ("redis", "reachable", True)
            server.proc.send_signal(signal.SIGSTOP)  # a Redis that does not answer
            try:
                broken = await store.health()
            finally:
                server.proc.send_signal(signal.SIGCONT)
            assert (broken.check, broken.ok) == ("reachable", False)
            assert f"127.0.0.1:{server.port}" in broken.error
        finally:
            await store.close()


async def test_a_read_redis_does_not_answer_is_a_store_unavailable_error(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=0.3)
        await store.start()
        try:
            server.proc.send_signal(signal.SIGSTOP)  # a Redis that does not answer
            try:
                with pytest.raises(StoreUnavailable) as err:
                    await store.load("s1")
            finally:
                server.proc.send_signal(signal.SIGCONT)
            assert f"127.0.0.1:{server.port}" in str(err.value)
            assert await store.load("s1") is None  # and reads work again once it is back
        finally:
            await store.close()


async def test_redis_close_counts_the_writes_it_could_not_send(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A close waits for the writer at most twice the timeout: what it leaves unsent
    (Redis not answering) is counted and logged as dropped, not lost silently."""
    caplog.set_level(logging.ERROR, logger="xwm_bridge.store")
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, timeout=0.3)
        await store.start()
        writes = 3 * redis_writer.MAX_BATCH  # three batches of 0.3 s: past the close's wait
        server.proc.send_signal(signal.SIGSTOP)
        try:
            for n in range(writes):
                store.save(SessionRecord(f"s{n}", "t"))
            await wait_for(store.close(), 5)
        finally:
            server.proc.send_signal(signal.SIGCONT)
    assert store.counters.write_errors == writes
    assert "session store closed with writes unsent; dropped" in caplog.text


# --- bounds by bytes (issue 16 item 12) -----------------------------------------------


async def test_ledger_is_bounded_by_bytes(make_store: Factory) -> None:
    store = await make_store(StoreLimits(ledger_max_entries=512, ledger_max_bytes=64 * 1024))
    store.save(SessionRecord("s1", "t1"))
    big = "x" * 10_000
    for seq in range(1, 41):  # 40 × ~10 KB: only the newest ~6 fit
        message = update("s1", seq)
        message["params"]["delta"] = big
        store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", message))
    kept = [m["params"]["seq"] for m in await messages(store, "s1", 0, 1000)]
    assert 3 <= len(kept) <= 6 and kept == list(range(41 - len(kept), 41))
    # a later small entry still fits, and the oldest big ones make room for it
    store.append("s1", LedgerEntry(emitted_pos(41), "turn-1", update("s1", 41)))
    again = [m["params"]["seq"] for m in await messages(store, "s1", 0, 1000)]
    assert again[-1] == 41 and len(again) <= 7


async def test_memory_store_has_a_global_cap() -> None:
    store = MemoryStore(StoreLimits(memory_max_bytes=200_000, ledger_max_bytes=10**9))
    big = {"d": "y" * 5_000}
    for i in range(100):  # 100 sessions × 5 entries × 5 KB = 2.5 MB offered
        store.save(SessionRecord(f"s{i}", "t", history=("p",)))
        for seq in range(1, 6):
            store.append(f"s{i}", LedgerEntry(emitted_pos(seq), "turn-1", big))
    assert store.bytes_held <= 200_000
    # the newest session is complete, the oldest ledgers went first
    assert len(await store.replay("s99", 0, 100)) == 5
    assert await store.replay("s0", 0, 100) == []
    assert await store.load("s99") is not None
    store.delete("s99")
    assert store.bytes_held < 200_000


async def test_the_owner_survives_in_the_store(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1", owner="bearer:abc"))
    loaded = await store.load("s1")
    assert loaded is not None and loaded.owner == "bearer:abc"


async def test_sqlite_files_from_before_owners_are_migrated(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sessions.db"
    old = sqlite3.connect(path)
    old.executescript(  # layout 1 (issue 15): event ids, no owners
        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL,"
        " provider TEXT NOT NULL, history BLOB NOT NULL, seq INTEGER NOT NULL,"
        " last_turn_id TEXT NOT NULL, last_turn_status TEXT NOT NULL, upstream BLOB NOT NULL,"
        " updated_at REAL NOT NULL, events INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,"
        " pos INTEGER NOT NULL, turn_id TEXT NOT NULL, message BLOB NOT NULL, ts REAL NOT NULL,"
        " event_id INTEGER NOT NULL DEFAULT 0, kind TEXT NOT NULL DEFAULT 'notification');"
        "INSERT INTO sessions VALUES ('old', 't', 'codex', '[]', 3, 'turn-1', 'completed', '[]',"
        f" {time.time()}, 7);"
        "PRAGMA user_version = 1;"
    )
    old.commit()
    old.close()
    store = SQLiteStore(path)
    await store.start()
    try:
        loaded = await store.load("old")
        assert loaded is not None and loaded.owner == "" and loaded.seq == 3
        assert loaded.events == 7  # layout 1's data is kept as it was
        version = await store._call(lambda db: db.execute("PRAGMA user_version").fetchone()[0])
        assert version == SCHEMA_VERSION
        store.save(SessionRecord("new", "t", owner="bearer:x"))
        new = await store.load("new")
        assert new is not None and new.owner == "bearer:x"
    finally:
        await store.close()


# --- operator views (issue 13): turns, pending permissions, the session list -------------


async def test_turns_round_trip_and_are_bounded(make_store: Factory) -> None:
    from xwm_bridge.store.records import TURNS_PER_SESSION, TurnRecord

    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1"))
    first = TurnRecord("s1", "turn-0000000001", prompt="hi", started_at=1.0)
    store.save_turn(first)
    done = TurnRecord(
        "s1", "turn-0000000001", prompt="hi", status="completed", started_at=1.0,
        finished_at=2.5, usage={"used": 3}, result={"success": True, "output": "ok"},
    )  # fmt: skip
    store.save_turn(done)  # an upsert, not a second turn
    turns = await store.turns("s1", 10)
    assert turns == [done]
    for i in range(2, TURNS_PER_SESSION + 5):
        store.save_turn(TurnRecord("s1", f"turn-{i:010d}", started_at=float(i)))
    turns = await store.turns("s1", 1000)
    assert len(turns) == TURNS_PER_SESSION
    assert turns[-1].turn_id == f"turn-{TURNS_PER_SESSION + 4:010d}"  # the newest kept
    assert [t.started_at for t in turns] == sorted(t.started_at for t in turns)
    assert len(await store.turns("s1", 3)) == 3
    store.delete("s1")
    assert await store.turns("s1", 10) == []


async def test_list_sessions_filters_and_pages(make_store: Factory) -> None:
    from xwm_bridge.store.records import SessionQuery, TurnRecord

    store = await make_store(StoreLimits())
    base = time.time() - 100  # a Redis record expires `retention` after its update
    for i, (status, provider, thread) in enumerate(
        [("completed", "codex", "a"), ("failed", "codex", "b"), ("running", "fake", "a")]
    ):
        sid = f"s{i}"
        store.save(
            SessionRecord(
                sid, thread, provider=provider, last_turn_id=f"turn-{i}",
                last_turn_status=status, updated_at=base + i,
            )
        )  # fmt: skip
        store.save_turn(TurnRecord(sid, f"turn-{i}", status=status, started_at=base + i))
    page = await store.list_sessions(SessionQuery())
    assert [r.session_id for r, _ in page.items] == ["s2", "s1", "s0"]
    assert all(t is not None and t.turn_id == r.last_turn_id for r, t in page.items)
    assert page.next_after is None

    async def ids(**kw: Any) -> list[str]:
        return [r.session_id for r, _ in (await store.list_sessions(SessionQuery(**kw))).items]

    assert await ids(state="failed") == ["s1"]
    assert await ids(state="idle") == ["s1", "s0"]
    assert await ids(provider="codex") == ["s1", "s0"]
    assert await ids(thread_id="a") == ["s2", "s0"]
    assert await ids(updated_since=base + 1) == ["s2", "s1"]
    first = await store.list_sessions(SessionQuery(limit=2))
    assert [r.session_id for r, _ in first.items] == ["s2", "s1"]
    assert first.next_after is not None
    rest = await store.list_sessions(SessionQuery(limit=2, after=first.next_after))
    assert [r.session_id for r, _ in rest.items] == ["s0"] and rest.next_after is None
    store.delete("s1")
    assert await ids() == ["s2", "s0"]


async def test_pending_permissions_survive_until_resolved(make_store: Factory) -> None:
    from xwm_bridge.store.records import PermissionRecord

    store = await make_store(StoreLimits())
    asked = PermissionRecord(
        "s1", "perm-1", turn_id="turn-1", tool_call={"kind": "edit", "title": "Write x"},
        options=({"optionId": "once", "kind": "allow_once"},), created_at=5.0,
    )  # fmt: skip
    store.save_permission(asked)
    store.save_permission(PermissionRecord("s2", "perm-2", created_at=6.0))
    pending = await store.permissions()
    assert [p.request_id for p in pending] == ["perm-1", "perm-2"]
    assert pending[0].tool_call == asked.tool_call and pending[0].options == asked.options
    store.delete_permission("s1", "perm-1")
    assert [p.request_id for p in await store.permissions()] == ["perm-2"]
    store.delete("s2")  # a session's requests go with it
    assert await store.permissions() == []


# --- event ids (issue 15 item 2) ---------------------------------------------------------


async def test_event_ids_kinds_and_results_round_trip(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1", seq=0))
    store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", update("s1", 1), event_id=1))
    for n in (2, 3, 4):  # three relayed frames after update 1
        store.append("s1", LedgerEntry(relayed_pos(1), "turn-1", {"n": n}, event_id=n))
    store.append(
        "s1", LedgerEntry(relayed_pos(1), "turn-1", {"success": True}, event_id=5, kind=RESULT)
    )
    entries = await store.replay("s1", 0, 100)
    assert [e.event_id for e in entries] == [1, 2, 3, 4, 5]
    assert [e.kind for e in entries] == [NOTIFICATION] * 4 + [RESULT]
    assert entries[-1].message == {"success": True} and entries[-1].turn_id == "turn-1"
    assert [e.event_id for e in await store.replay("s1", 0, 100, after_event=3)] == [4, 5]
    assert await store.replay("s1", 0, 100, after_event=5) == []
    # afterSeq keeps its meaning: after update 1 = the relayed frames and the result
    assert [e.event_id for e in await store.replay("s1", 1, 100)] == [2, 3, 4, 5]
    loaded = await store.load("s1")
    assert loaded is not None and loaded.events == 5 and loaded.seq == 1
    store.save(SessionRecord("s1", "t1", seq=1, events=5, last_turn_status=RUNNING))
    await store.recover()
    recovered = await store.replay("s1", 0, 100, after_event=5)
    assert [e.event_id for e in recovered] == [6]
    again = await store.load("s1")
    assert again is not None and again.events == 6


async def test_sqlite_opens_a_database_of_the_previous_layout(tmp_path: Path) -> None:
    """A sessions.db written before event ids existed is migrated in place on open."""
    import sqlite3

    import orjson

    path = tmp_path / "sessions.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE sessions (session_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL,
            provider TEXT NOT NULL, history BLOB NOT NULL, seq INTEGER NOT NULL,
            last_turn_id TEXT NOT NULL, last_turn_status TEXT NOT NULL,
            upstream BLOB NOT NULL, updated_at REAL NOT NULL);
        CREATE TABLE ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            pos INTEGER NOT NULL, turn_id TEXT NOT NULL, message BLOB NOT NULL, ts REAL NOT NULL);
        """
    )
    now = time.time()
    db.execute(
        "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("old", "t", "codex", b'["hi"]', 2, "turn-1", "completed", b"[]", now),
    )
    for pos in (2, 3, 3, 4, 5):
        db.execute(
            "INSERT INTO ledger (session_id, pos, turn_id, message, ts) VALUES (?, ?, ?, ?, ?)",
            ("old", pos, "turn-1", orjson.dumps({"pos": pos}), now),
        )
    db.commit()
    db.close()
    store = SQLiteStore(path)
    await store.start()
    try:
        entries = await store.replay("old", 0, 100)
        assert [e.message["pos"] for e in entries] == [2, 3, 3, 4, 5]
        assert [e.event_id for e in entries] == [1, 2, 3, 4, 5]
        assert [e.message["pos"] for e in await store.replay("old", 0, 9, after_event=2)] == [
            3,
            4,
            5,
        ]
        loaded = await store.load("old")
        assert loaded is not None and loaded.events == 5 and loaded.history == ("hi",)
        store.append("old", LedgerEntry(emitted_pos(3), "turn-2", {"pos": 6}, event_id=6))
        assert [e.event_id for e in await store.replay("old", 0, 100, after_event=5)] == [6]
        version = await store._call(lambda db: db.execute("PRAGMA user_version").fetchone()[0])
        assert version == SCHEMA_VERSION  # 0 → 1 (event ids) → 2 (owners) → 3 (counts)
    finally:
        await store.close()


async def test_sqlite_moves_layout_3_histories_into_rows(tmp_path: Path) -> None:
    """Layout 3 kept each history as a JSON array in the session row; on open it becomes
    rows of ``history``, and later saves add to them."""
    import sqlite3

    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()  # a current database, then made to look like layout 3
    await store.close()
    db = sqlite3.connect(path)
    db.executescript(
        """
        DROP TABLE history;
        ALTER TABLE sessions DROP COLUMN history_from;
        ALTER TABLE sessions DROP COLUMN prompts;
        PRAGMA user_version = 3;
        """
    )
    db.execute(
        "INSERT INTO sessions (session_id, thread_id, provider, history, seq, last_turn_id,"
        " last_turn_status, upstream, updated_at, events, owner)"
        " VALUES ('old', 't', 'codex', ?, 2, 'turn-1', 'completed', '[]', ?, 0, '')",
        ('["one", "two", "thr\u00e9e"]', time.time()),
    )
    db.commit()
    db.close()
    store = SQLiteStore(path)
    await store.start()
    try:
        loaded = await store.load("old")
        assert loaded is not None and loaded.history == ("one", "two", "thr\u00e9e")
        assert loaded.prompts == 3
        session = Session.restore(loaded)
        session.add_prompt("four")
        store.save(session.snapshot())
        again = await store.load("old")
        assert again is not None and again.history == ("one", "two", "thr\u00e9e", "four")
        rows = await store._call(
            lambda db: db.execute("SELECT history, history_from, prompts FROM sessions").fetchall()
        )
        assert rows == [(b"[]", 0, 4)] or rows == [("[]", 0, 4)]
        version = await store._call(lambda db: db.execute("PRAGMA user_version").fetchone()[0])
        assert version == SCHEMA_VERSION == 5
    finally:
        await store.close()


async def test_sqlite_history_survives_a_restart_and_a_reset(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    session = Session("s", "t")
    for prompt in ("a", "b", "c"):
        session.add_prompt(prompt)
        store.save(session.snapshot())
    await store.close()
    store = SQLiteStore(path)  # a new process: the writer knows nothing yet
    await store.start()
    try:
        loaded = await store.load("s")
        assert loaded is not None and loaded.history == ("a", "b", "c")
        restored = Session.restore(loaded)
        restored.add_prompt("d")
        store.save(restored.snapshot())
        loaded = await store.load("s")
        assert loaded is not None and loaded.history == ("a", "b", "c", "d")
        store.delete("s")  # session.start: a new conversation under the same id
        fresh = Session("s", "t")
        fresh.add_prompt("new")
        store.save(fresh.snapshot())
        loaded = await store.load("s")
        assert loaded is not None and loaded.history == ("new",) and loaded.prompts == 1
    finally:
        await store.close()


async def test_redis_numbers_ledgers_of_the_previous_layout(tmp_path: Path) -> None:
    import orjson

    async with redis_server(tmp_path) as server:
        writer = RedisStore(server.url, prefix="m:")
        await writer.start()
        try:
            now = time.time()
            await writer.client.hset("m:s:old", mapping={"thread_id": "t", "seq": 2})
            for pos in (2, 3, 3, 4):  # entries as the previous version wrote them
                item = {"p": pos, "t": "turn-1", "ts": now, "m": {"pos": pos}}
                await writer.client.rpush("m:l:old", orjson.dumps(item))
            await writer.client.expire("m:l:old", 600)
            await writer.client.delete("m:schema")
        finally:
            await writer.close()
        store = RedisStore(server.url, prefix="m:")
        await store.start()
        try:
            entries = await store.replay("old", 0, 100)
            assert [e.message["pos"] for e in entries] == [2, 3, 3, 4]
            assert [e.event_id for e in entries] == [1, 2, 3, 4]
            loaded = await store.load("old")
            assert loaded is not None and loaded.events == 4
            assert await store.client.ttl("m:l:old") > 0
            assert await store.migrate() == 0  # done once
        finally:
            await store.close()


async def test_redis_migration_touches_only_its_own_prefix(tmp_path: Path) -> None:
    """The prefix went into SCAN MATCH unescaped: a store with prefix ``a*:`` also
    renumbered the old-layout ledgers of the store with prefix ``ab:``."""
    import orjson

    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="a*:")
        await store.start()
        try:
            old = {"p": 1, "t": "turn-1", "ts": time.time(), "m": {"pos": 1}}
            await store.client.rpush("ab:l:other", orjson.dumps(old))
            await store.client.rpush("a*:l:mine", orjson.dumps(old))
            await store.client.delete("a*:schema")
            assert await store.migrate() == 1
            assert "e" not in orjson.loads(await store.client.lindex("ab:l:other", 0))
            assert orjson.loads(await store.client.lindex("a*:l:mine", 0))["e"] == 1
        finally:
            await store.close()


async def test_redis_a_batch_that_cannot_be_built_is_a_failed_write_not_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="b:")
        await store.start()
        try:
            build = store._commands.batch
            calls = 0

            def failing_once(pipe: Any, writes: list[Any]) -> None:
                nonlocal calls
                calls += 1
                if calls == 1:
                    raise RuntimeError("unexpected")
                build(pipe, writes)

            monkeypatch.setattr(store._commands, "batch", failing_once)
            store.save(SessionRecord("lost", "t"))
            assert await store.load("lost") is None  # the read comes after the batch
            assert store.counters.restarts == 0
            assert store.counters.write_errors == 1 and "unexpected" in store.counters.last_error
            assert not store.alive()  # /readyz says so until a write goes through
            health = await store.health(2.0)  # its own probe write is not enough
            assert not health.ok and "writes failing" in health.error
            store.save(SessionRecord("kept", "t"))
            assert await store.load("kept") is not None
            assert store.counters.last_error == "" and store.alive()
        finally:
            await store.close()


async def test_sqlite_health_stays_failed_while_real_writes_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk nearly full can take the health probe's one small row and refuse a batch
    of real writes: /readyz (the probe) says unready while real writes failed
    recently, not ready again at its next poll; a real write that goes through, or
    RECENT_ERROR_S without a failure, makes it ready."""
    import sqlite3

    from xwm_bridge.store import base

    store = SQLiteStore(tmp_path / "s.db")
    await store.start()
    try:
        apply = store._apply
        failing = True

        def full(db: Any, writes: list[Any]) -> None:
            if failing:
                raise sqlite3.OperationalError("database or disk is full")
            apply(db, writes)

        monkeypatch.setattr(store, "_apply", full)
        store.save(SessionRecord("lost", "t"))
        assert await store.load("lost") is None  # the read runs after the failed batch
        health = await store.health(2.0)
        assert not health.ok and "disk is full" in health.error
        assert not (await store.health(2.0)).ok  # not cleared by its own probe
        monkeypatch.setattr(base, "RECENT_ERROR_S", 0.0)  # long ago: the probe decides
        assert (await store.health(2.0)).ok and store.alive()
        monkeypatch.setattr(base, "RECENT_ERROR_S", 30.0)
        store.save(SessionRecord("lost-2", "t"))
        assert await store.load("lost-2") is None
        assert not (await store.health(2.0)).ok
        failing = False
        store.save(SessionRecord("kept", "t"))  # a real write goes through: ready at once
        assert await store.load("kept") is not None
        assert (await store.health(2.0)).ok and store.alive()
    finally:
        await store.close()


async def test_a_running_store_reports_its_health(make_store: Factory) -> None:
    store = await make_store(StoreLimits())
    assert (await store.health(2.0)).ok
    store.save(SessionRecord("s1", "t1"))
    assert (await store.health(2.0)).ok


async def test_sqlite_health_after_close_and_second_opener_refused(tmp_path: Path) -> None:
    """Issue 15 item 12: one process per database; the second opener is told who."""
    import os

    from xwm_bridge.store.base import StoreError

    path = tmp_path / "sessions.db"
    first = SQLiteStore(path)
    await first.start()
    second = SQLiteStore(path)
    with pytest.raises(StoreError) as info:
        await second.start()
    message = str(info.value)
    assert str(path) in message and f"pid {os.getpid()}" in message
    assert "XWM_STATE_DIR" in message
    await first.close()
    assert "not running" in (await first.health(1.0)).error
    await second.start()  # the lock went with the first store
    try:
        assert (await second.health(1.0)).ok
    finally:
        await second.close()


# --- back-pressure: a store that falls behind slows its writers, its queue stays bounded ---


async def _waits_until_drained(
    store: Any, block: Callable[[], None], entered: Callable[[], bool], release: Callable[[], None]
) -> None:
    import asyncio

    store.backlog.high, store.backlog.low = 20, 5
    await store.writable()  # nothing queued: at once
    block()
    store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", update("s1", 1)))
    await wait_until(entered)  # the writer holds that batch, blocked
    for seq in range(2, 42):
        store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
    waiter = asyncio.ensure_future(store.writable())
    done, _ = await asyncio.wait({waiter}, timeout=0.2)
    assert not done  # 40 queued > 20: the writer waits
    release()
    await asyncio.wait_for(waiter, 5)  # the store caught up: it resumes
    assert len(await messages(store, "s1", 0, 100)) == 41  # nothing lost


async def test_sqlite_writers_wait_while_the_store_thread_is_behind(tmp_path: Path) -> None:
    import threading

    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    gate, inside = threading.Event(), threading.Event()
    apply = store._apply

    def slow_apply(db: Any, writes: Any) -> None:
        inside.set()
        gate.wait(10)
        apply(db, writes)

    try:
        await _waits_until_drained(
            store, lambda: setattr(store, "_apply", slow_apply), inside.is_set, gate.set
        )
    finally:
        gate.set()
        await store.close()


async def test_redis_writers_wait_while_the_writer_is_behind(tmp_path: Path) -> None:
    import asyncio

    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, StoreLimits(), prefix="bp:")
        await store.start()
        gate, inside = asyncio.Event(), asyncio.Event()
        flush = store._flush

        async def slow_flush(writes: Any) -> None:
            if writes:
                inside.set()
                await asyncio.wait_for(gate.wait(), 10)
            await flush(writes)

        try:
            await _waits_until_drained(
                store, lambda: setattr(store, "_flush", slow_flush), inside.is_set, gate.set
            )
        finally:
            gate.set()
            await store.close()


async def test_writable_gives_up_after_its_deadline(tmp_path: Path) -> None:
    # a stuck store thread does not hang its writers for ever
    import threading

    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    gate = threading.Event()
    apply = store._apply

    def stuck(db: Any, writes: Any) -> None:
        gate.wait(10)
        apply(db, writes)

    store._apply = stuck  # type: ignore[method-assign]
    store.backlog.high, store.backlog.low, store.backlog.wait_s = 5, 1, 0.1
    try:
        for seq in range(1, 20):
            store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
        started = time.monotonic()
        await store.writable()
        assert 0.05 < time.monotonic() - started < 5
    finally:
        gate.set()
        await store.close()


async def test_sqlite_table_keeps_the_byte_bound_when_entries_grow(tmp_path: Path) -> None:
    # small entries are bounded by the count alone (no full byte trim per trim); once
    # big ones arrive the byte trim runs again, so the table itself stays bounded
    import sqlite3

    path = tmp_path / "sessions.db"
    limits = StoreLimits(ledger_max_entries=16, ledger_max_bytes=4096)
    store = SQLiteStore(path, limits)
    await store.start()
    try:
        store.save(SessionRecord("s1", "t1"))
        for seq in range(1, 41):  # ~100 bytes each: 16 of them fit
            store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", update("s1", seq)))
        await messages(store, "s1", 0, 1)  # a read: every earlier write is applied
        for seq in range(41, 61):  # ~1 KB each: only about 4 fit
            message = update("s1", seq)
            message["params"]["delta"] = "y" * 1000
            store.append("s1", LedgerEntry(emitted_pos(seq), "turn-1", message))
        kept = [m["params"]["seq"] for m in await messages(store, "s1", 0, 1000)]
        assert kept and kept[-1] == 60
    finally:
        await store.close()
    db = sqlite3.connect(path)
    total, count = db.execute(
        "SELECT SUM(length(message)), COUNT(*) FROM ledger WHERE session_id = 's1'"
    ).fetchone()
    db.close()
    # trimming runs every cap/8 entries or max_bytes/8 bytes: a little slack, not 20 KB
    assert total <= 4096 + 4096 // 8 + 1100, (total, count)
    assert count <= 16 + 2


def _batch(first_event: int, seq: int, n: int, turn: str = "turn-1") -> list[LedgerEntry]:
    return [
        LedgerEntry(
            relayed_pos(seq),
            turn,
            {"method": "upstream", "n": first_event + i},
            event_id=first_event + i,
        )
        for i in range(n)
    ]


async def test_entries_appended_together_read_back_one_by_one(make_store: Factory) -> None:
    store = await make_store(StoreLimits(ledger_max_entries=7))
    store.save(SessionRecord("s1", "t1", seq=1))
    store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", update("s1", 1), event_id=1))
    store.append_many("s1", _batch(2, 1, 4))  # event ids 2..5, after seq 1
    store.append("s1", LedgerEntry(emitted_pos(2), "turn-1", update("s1", 2), event_id=6))
    store.append_many("s1", _batch(7, 2, 3))  # 7..9
    everything = await store.replay("s1", 0, 100)
    # the newest 7 entries, cut inside the first batch
    assert [e.event_id for e in everything] == [3, 4, 5, 6, 7, 8, 9]
    assert [e.message.get("n") for e in everything if e.pos % 2] == [3, 4, 5, 7, 8, 9]
    assert {e.pos for e in everything[:3]} == {relayed_pos(1)}
    assert [e.event_id for e in await store.replay("s1", 0, 100, after_event=7)] == [8, 9]
    assert [e.event_id for e in await store.replay("s1", 0, 2, after_event=3)] == [4, 5]
    assert [e.event_id for e in await store.replay("s1", 1, 100)] == [3, 4, 5, 6, 7, 8, 9]
    assert [e.event_id for e in await store.replay("s1", 2, 100)] == [7, 8, 9]
    loaded = await store.load("s1")
    assert loaded is not None and loaded.seq == 2 and loaded.events == 9


async def test_a_batch_is_cut_by_the_byte_bound_entry_by_entry(make_store: Factory) -> None:
    store = await make_store(StoreLimits(ledger_max_bytes=2500))
    store.save(SessionRecord("s1", "t1"))
    batch = _batch(1, 1, 10)
    for entry in batch:
        entry.message["pad"] = "x" * 1000  # ~1 KB each: the newest 2 fit
    store.append_many("s1", batch)
    kept = await store.replay("s1", 0, 100)
    assert [e.event_id for e in kept] == [9, 10]


async def test_sqlite_keeps_a_batch_in_one_row_and_bounds_the_table(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "sessions.db"
    store = SQLiteStore(path, StoreLimits(ledger_max_entries=64))
    await store.start()
    try:
        store.save(SessionRecord("s1", "t1"))
        event = 1
        for seq in range(1, 41):
            store.append(
                "s1", LedgerEntry(emitted_pos(seq), "t", update("s1", seq), event_id=event)
            )
            store.append_many("s1", _batch(event + 1, seq, 20))
            event += 21
        kept = await store.replay("s1", 0, 1000)
        assert [e.event_id for e in kept] == list(range(event - 64, event))
    finally:
        await store.close()
    db = sqlite3.connect(path)
    rows, entries = db.execute(
        "SELECT COUNT(*), SUM(count) FROM ledger WHERE session_id = 's1'"
    ).fetchone()
    db.close()
    # 40 turns of 21 entries: 80 rows; trimmed to the newest 64 entries (+ cap/8 slack)
    assert rows <= 2 * (64 + 8) // 21 + 2 and entries <= 64 + 8 + 20, (rows, entries)
    store = SQLiteStore(path, StoreLimits(ledger_max_entries=64))
    await store.start()
    try:  # a restart reads the same entries
        assert [e.event_id for e in await store.replay("s1", 0, 1000)] == [e.event_id for e in kept]
        loaded = await store.load("s1")
        assert loaded is not None and loaded.events == event - 1
    finally:
        await store.close()


async def test_sqlite_drops_only_the_unencodable_entry_of_a_batch(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        store.save(SessionRecord("s1", "t1"))
        batch = _batch(1, 1, 5)
        batch[2].message["deep"] = nested(300)
        store.append_many("s1", batch)
        kept = await store.replay("s1", 0, 100)
        assert [e.event_id for e in kept] == [1, 2, 4, 5]
        assert store.counters.bad_records == 1
    finally:
        await store.close()


async def test_sqlite_prune_forgets_what_the_thread_tracked_of_a_pruned_session(
    tmp_path: Path,
) -> None:
    """A queued delete cleared the trim counters; prune kept them (bounded, but a stale
    largest-entry size cost an extra byte-trim query when the id came back)."""
    store = SQLiteStore(tmp_path / "sessions.db", StoreLimits(retention=60))
    await store.start()
    try:
        store.save(SessionRecord("old", "t", updated_at=time.time() - 3600))
        store.append("old", LedgerEntry(emitted_pos(1), "t", update("old", 1), event_id=1))
        await messages(store, "old", 0, 1)  # the batch is applied
        tracked = (store._untrimmed, store._untrimmed_bytes, store._largest)
        assert all("old" in d for d in tracked[:2])
        assert await store.prune() == 1
        assert not any("old" in d for d in (*tracked, store._untrimmed_turns))
    finally:
        await store.close()


async def test_sqlite_counters_stay_bounded_and_forgotten_sessions_are_trimmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from xwm_bridge.store import sqlite_thread

    monkeypatch.setattr(sqlite_thread, "MAX_TRACKED_SESSIONS", 8)
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path, StoreLimits(ledger_max_entries=64))
    await store.start()
    try:
        for seq in range(1, 70):  # trims at 8, 16, … 64: 5 entries past the cap stay
            store.append("a", LedgerEntry(emitted_pos(seq), "t", update("a", seq), event_id=seq))
        await messages(store, "a", 0, 1)
        for i in range(40):  # other sessions push "a" out of the counters
            store.append(f"s{i}", LedgerEntry(emitted_pos(1), "t", update(f"s{i}", 1), event_id=1))
            await messages(store, f"s{i}", 0, 1)  # one batch each
        tracked = (store._untrimmed, store._untrimmed_bytes, store._untrimmed_turns, store._largest)
        assert all(len(d) <= 8 + 1 for d in tracked), [len(d) for d in tracked]
        assert [m["params"]["seq"] for m in await messages(store, "a", 0, 1000)] == list(
            range(6, 70)
        )
    finally:
        await store.close()
    db = sqlite3.connect(path)
    (rows,) = db.execute("SELECT COUNT(*) FROM ledger WHERE session_id = 'a'").fetchone()
    db.close()
    assert rows == 64  # trimmed when it was forgotten


async def test_sqlite_keeps_temp_data_in_memory_and_checkpoints_every_4000_pages(
    tmp_path: Path,
) -> None:
    # statement journals of the batch's multi-row statements spilled to temp files
    # (open, writes, unlink) and the WAL was copied back every 1,000 pages
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        settings = await store._call(
            lambda db: tuple(
                db.execute(f"PRAGMA {name}").fetchone()[0]
                for name in ("temp_store", "wal_autocheckpoint", "journal_mode", "synchronous")
            )
        )
        assert settings == (2, 4000, "wal", 1)  # 2: MEMORY; 1: NORMAL
    finally:
        await store.close()


async def test_sqlite_turn_rows_stay_within_the_trim_slack(tmp_path: Path) -> None:
    import sqlite3

    from xwm_bridge.store import sqlite_thread
    from xwm_bridge.store.records import TURNS_PER_SESSION, TurnRecord

    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    try:
        store.save(SessionRecord("s1", "t1"))
        for i in range(3 * TURNS_PER_SESSION):
            store.save_turn(TurnRecord("s1", f"turn-{i:010d}", started_at=float(i)))
            if i % 16 == 0:
                await store.turns("s1", 1)  # separate batches, as turns arrive
        assert len(await store.turns("s1", 1000)) == TURNS_PER_SESSION
    finally:
        await store.close()
    db = sqlite3.connect(path)
    rows = db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
    db.close()
    assert TURNS_PER_SESSION <= rows <= TURNS_PER_SESSION + sqlite_thread.TURN_TRIM_EVERY


async def test_a_bad_entry_in_a_batch_retried_write_by_write_is_counted_once(
    tmp_path: Path,
) -> None:
    # the unencodable entry was counted when the batch was first built and again
    # when the failed batch (the save past 2^63) was applied write by write
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        store.save(SessionRecord("s1", "t1"))
        store.append("s1", LedgerEntry(emitted_pos(1), "turn-1", {"deep": nested(300)}))
        store.append("s1", LedgerEntry(emitted_pos(2), "turn-1", update("s1", 2)))
        store.save(SessionRecord("s2", "t", seq=2**70))  # the same batch: no await between
        assert [m["params"]["seq"] for m in await messages(store, "s1", 0, 10)] == [2]
        assert await store.load("s2") is None
        assert store.counters.bad_records == 2  # the entry and the save, once each
    finally:
        await store.close()


async def test_an_unencodable_turn_or_permission_record_is_dropped_alone(
    make_store: Factory,
) -> None:
    # Redis: the record's encoding raised out of the pipeline's building and the
    # whole batch (every write queued with it) was lost
    from xwm_bridge.store.records import PermissionRecord, TurnRecord

    store = await make_store(StoreLimits())
    store.save(SessionRecord("s1", "t1"))
    store.save_turn(TurnRecord("s1", "turn-bad", started_at=1.0, result={"deep": nested(300)}))
    store.save_permission(
        PermissionRecord("s1", "req-bad", "turn-bad", created_at=1.0, options=(nested(300),))
    )
    store.save_turn(TurnRecord("s1", "turn-good", started_at=2.0))
    store.save(SessionRecord("s2", "t2"))
    assert await store.load("s2") is not None
    # memory: the records had been kept as objects, and a view that returned
    # "turn-bad" was answered with -32603 (the wire encoder could not write it)
    assert [t.turn_id for t in await store.turns("s1", 10)] == ["turn-good"]
    assert [p.request_id for p in await store.permissions()] == []
    assert store.counters.bad_records == 2
