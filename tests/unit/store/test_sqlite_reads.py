"""xwm_bridge.store.sqlite_reads: the reads as functions of a connection, against a
database opened as the store thread opens it (no thread)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from xwm_bridge.store import sqlite_history, sqlite_reads
from xwm_bridge.store.base import (
    INTERRUPTED,
    RUNNING,
    LedgerEntry,
    SessionRecord,
    StoreLimits,
    emitted_pos,
)
from xwm_bridge.store.records import PermissionRecord, SessionQuery, TurnRecord
from xwm_bridge.store.sqlite_schema import connect
from xwm_bridge.store.sqlite_writes import (
    UPSERT_TURN,
    apply_permission,
    insert_entry,
    turn_row,
    upsert,
)

MIB = 1 << 20


def database(tmp_path: Path) -> sqlite3.Connection:
    return connect(tmp_path / "sessions.db")


def save(db: sqlite3.Connection, r: SessionRecord) -> None:
    upsert(db, r)
    sqlite_history.HistoryWriter(16).write(db, [r])


def save_turn(db: sqlite3.Connection, t: TurnRecord) -> None:
    db.execute(UPSERT_TURN, turn_row(t))


def event_ids(entries: list[LedgerEntry]) -> list[int]:
    return [e.event_id for e in entries]


def test_a_record_reads_back_with_its_history_and_its_ledgers_top(tmp_path: Path) -> None:
    db = database(tmp_path)
    r = SessionRecord(
        "s1", "t1", "p", ("hi", "there"), 2, upstream=(("k", "v"),), events=3, prompts=2
    )
    save(db, r)
    assert sqlite_reads.record(db, "s1") == r
    assert sqlite_reads.record(db, "nope") is None
    # an entry past the record (its save still queued): seq and events follow it
    insert_entry(db, "s1", LedgerEntry(emitted_pos(7), "t", {"n": 1}, event_id=9))
    found = sqlite_reads.record(db, "s1")
    assert found is not None and (found.seq, found.events, found.history) == (7, 9, r.history)


def test_the_ledger_read_takes_the_first_entries_after_the_cursor(tmp_path: Path) -> None:
    db = database(tmp_path)
    for i in range(1, 6):
        insert_entry(db, "s1", LedgerEntry(emitted_pos(i), "t", {"n": i}, ts=100.0 + i, event_id=i))
    assert event_ids(sqlite_reads.ledger(db, "s1", 0, 2, 1, 0.0, 100, MIB)) == [2, 3]
    assert event_ids(sqlite_reads.ledger(db, "s1", 3, 9, None, 0.0, 100, MIB)) == [4, 5]
    # none older than the horizon; the newest `cap` only
    assert event_ids(sqlite_reads.ledger(db, "s1", 0, 9, None, 103.5, 100, MIB)) == [4, 5]
    assert event_ids(sqlite_reads.ledger(db, "s1", 0, 9, None, 0.0, 2, MIB)) == [4, 5]


def test_turns_are_the_newest_oldest_first(tmp_path: Path) -> None:
    db = database(tmp_path)
    for i in range(5):
        save_turn(db, TurnRecord("s1", f"t{i}", started_at=float(i)))
    assert [t.turn_id for t in sqlite_reads.turns(db, "s1", 3)] == ["t2", "t3", "t4"]
    assert sqlite_reads.turns(db, "s1", -1) == []


def test_a_page_of_sessions_newest_first_with_the_next_cursor(tmp_path: Path) -> None:
    db = database(tmp_path)
    for i in range(5):
        status = RUNNING if i == 3 else "completed"
        r = SessionRecord(f"s{i}", "t", last_turn_id="x", last_turn_status=status, updated_at=i)
        save(db, r)
    save_turn(db, TurnRecord("s4", "x", status="completed"))
    query = SessionQuery(limit=2, state="idle")
    page = sqlite_reads.session_page(db, *sqlite_reads.session_sql(query), query.limit)
    assert [(r.session_id, t and t.turn_id) for r, t in page.items] == [("s4", "x"), ("s2", None)]
    assert page.next_after == (2.0, "s2")
    query = SessionQuery(limit=2, state="idle", after=page.next_after)
    page = sqlite_reads.session_page(db, *sqlite_reads.session_sql(query), query.limit)
    assert [r.session_id for r, _ in page.items] == ["s1", "s0"]
    assert page.next_after is None


def test_recover_interrupts_running_turns_and_drops_pending_requests(tmp_path: Path) -> None:
    db = database(tmp_path)
    running = SessionRecord(
        "s1", "t", "p", ("go",), seq=1, last_turn_id="x", last_turn_status=RUNNING, events=1
    )
    save(db, running)
    save(db, SessionRecord("s2", "t", "p", last_turn_id="y", last_turn_status="completed"))
    apply_permission(db, ("perm", PermissionRecord("s1", "r1", created_at=1.0)))
    assert [p.request_id for p in sqlite_reads.permissions(db)] == ["r1"]
    assert sqlite_reads.recover(db) == ["s1"]
    assert sqlite_reads.permissions(db) == []
    fixed = sqlite_reads.record(db, "s1")
    assert fixed is not None
    assert (fixed.last_turn_status, fixed.seq, fixed.events) == (INTERRUPTED, 2, 2)
    assert event_ids(sqlite_reads.ledger(db, "s1", 0, 9, None, 0.0, 9, MIB)) == [2]
    (turn,) = sqlite_reads.turns(db, "s1", 9)
    assert (turn.turn_id, turn.status, turn.prompt) == ("x", INTERRUPTED, "go")
    assert sqlite_reads.recover(db) == []  # nothing running now


def test_prune_deletes_stale_sessions_old_entries_and_orphan_turns(tmp_path: Path) -> None:
    db = database(tmp_path)
    limits = StoreLimits(retention=100.0, ledger_max_age=10.0)
    save(db, SessionRecord("old", "t", updated_at=800.0))
    save(db, SessionRecord("new", "t", updated_at=950.0))
    insert_entry(db, "new", LedgerEntry(emitted_pos(1), "t", {}, ts=985.0, event_id=1))
    insert_entry(db, "new", LedgerEntry(emitted_pos(2), "t", {}, ts=995.0, event_id=2))
    save_turn(db, TurnRecord("gone", "x"))
    forgotten: list[str] = []
    assert sqlite_reads.prune(db, 1000.0, limits, forgotten.append) == 1
    assert forgotten == ["old"]
    assert sqlite_reads.record(db, "old") is None
    assert sqlite_reads.record(db, "new") is not None
    assert event_ids(sqlite_reads.ledger(db, "new", 0, 9, None, 0.0, 9, MIB)) == [2]
    assert sqlite_reads.turns(db, "gone", 9) == []


def test_a_prune_that_fails_midway_deletes_nothing(tmp_path: Path) -> None:
    """One transaction: a delete that fails (here a trigger refuses the history rows'
    delete, as a full or read-only disk would fail a write) leaves the stale session
    whole for the next prune, not its record gone and its history rows orphaned."""
    db = database(tmp_path)
    limits = StoreLimits(retention=100.0, ledger_max_age=10.0)
    save(db, SessionRecord("old", "t", history=("first prompt",), updated_at=800.0))
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    history = next(t for t in tables if "history" in t)
    db.execute(
        f"CREATE TRIGGER refuse BEFORE DELETE ON {history} BEGIN SELECT RAISE(ABORT, 'disk'); END"
    )
    forgotten: list[str] = []
    with pytest.raises(sqlite3.IntegrityError, match="disk"):
        sqlite_reads.prune(db, 1000.0, limits, forgotten.append)
    kept = sqlite_reads.record(db, "old")
    assert kept is not None and kept.history == ("first prompt",)
    assert forgotten == []  # what the store thread tracked of it still holds
    db.execute("DROP TRIGGER refuse")
    assert sqlite_reads.prune(db, 1000.0, limits, forgotten.append) == 1
    assert sqlite_reads.record(db, "old") is None and forgotten == ["old"]
