"""store/sqlite_history.py: prompt rows written per save, against an in-memory SQLite."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.store import sqlite_history as sh
from xwm_bridge.store.base import SessionRecord
from xwm_bridge.store.sqlite_rows import chunk_sizes


def database() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)  # as the store opens it
    db.executescript(sh.SCHEMA)
    return db


def record(sid: str, history: list[str], prompts: int, history_id: int) -> SessionRecord:
    return SessionRecord(sid, sid, history=tuple(history), prompts=prompts, history_id=history_id)


def stored(db: sqlite3.Connection, r: SessionRecord) -> tuple[str, ...]:
    start, end = sh.span(r)
    return sh.read(db, r.session_id, start, end)


def test_a_save_of_the_same_session_writes_only_its_new_prompts() -> None:
    db, writer = database(), sh.HistoryWriter(100)
    history = [f"p{i}" for i in range(64)]
    writer.write(db, [record("s", history, 64, 1)])
    before = db.total_changes
    history = [*history[1:], "p64"]
    writer.write(db, [record("s", history, 65, 1)])
    assert db.total_changes - before == 1  # one row, not 64
    assert stored(db, record("s", history, 65, 1)) == tuple(history)


def test_another_session_object_rewrites_the_rows() -> None:
    db, writer = database(), sh.HistoryWriter(100)
    writer.write(db, [record("s", ["old0", "old1", "old2"], 3, 1)])
    new = record("s", ["new0", "new1"], 2, 2)  # reset without the store seeing a delete
    writer.write(db, [new])
    assert stored(db, new) == ("new0", "new1")
    assert db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == 2
    unknown = record("s", ["x0", "x1", "x2", "x3"], 4, 0)  # no id: always rewritten
    writer.write(db, [unknown])
    assert stored(db, unknown) == ("x0", "x1", "x2", "x3")


def test_rows_below_the_history_are_deleted_every_few_prompts() -> None:
    db, writer = database(), sh.HistoryWriter(100)
    history: list[str] = []
    for i in range(40):
        history = [*history, f"p{i}"][-4:]  # a history of 4
        writer.write(db, [record("s", history, i + 1, 7)])
    rows = db.execute("SELECT COUNT(*) FROM history").fetchone()[0]
    assert 4 <= rows < 4 + sh.TRIM_EVERY


def test_forgotten_sessions_are_rewritten_and_the_map_stays_bounded() -> None:
    db, writer = database(), sh.HistoryWriter(4)
    for i in range(10):
        writer.write(db, [record(f"s{i}", ["a"], 1, i + 1)])
    assert len(writer._known) <= 4
    again = record("s0", ["a", "b"], 2, 1)
    writer.write(db, [again])
    assert stored(db, again) == ("a", "b")


@dataclass
class Model:
    """A session as core/sessions.py keeps it: a capped history, a prompt count."""

    history_id: int
    history: list[str] = field(default_factory=list)
    prompts: int = 0

    def add(self, prompt: str, cap: int) -> None:
        self.history.append(prompt)
        self.prompts += 1
        del self.history[:-cap]

    def snapshot(self, sid: str) -> SessionRecord:
        return record(sid, list(self.history), self.prompts, self.history_id)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "add", "save", "skip", "reset", "forget", "fail"]),
            st.integers(0, 2),
            st.integers(1, 6),
        ),
        max_size=60,
    )
)
def test_the_table_always_holds_the_last_saved_history(ops: list[tuple[str, int, int]]) -> None:
    """Adds, saves (some superseded before they reach the store), resets (a new
    object, the store deletes the rows), forgotten sessions and failed transactions:
    reading back gives the history of each session's last applied save."""
    db, writer = database(), sh.HistoryWriter(2)
    ids = iter(range(1, 10_000))
    live = {f"s{i}": Model(next(ids)) for i in range(3)}
    saved: dict[str, SessionRecord] = {}
    counter = 0
    for kind, which, cap in ops:
        sid = f"s{which}"
        session = live[sid]
        if kind == "add":
            counter += 1
            session.add(f"{sid}-{counter}", cap)
        elif kind == "save":
            db.execute("BEGIN")
            writer.write(db, [session.snapshot(sid)])
            db.execute("COMMIT")
            saved[sid] = session.snapshot(sid)
        elif kind == "skip":  # a save superseded in its batch: never applied
            pass
        elif kind == "reset":
            db.execute(sh.DELETE_ALL, (sid,))
            writer.forget(sid)
            live[sid] = Model(next(ids))
            saved.pop(sid, None)
        elif kind == "forget":
            writer.forget(sid)
        else:  # a transaction that fails after writing: rolled back, writer cleared
            db.execute("BEGIN")
            writer.write(db, [session.snapshot(sid)])
            db.execute("ROLLBACK")
            writer.clear()
        for s, r in saved.items():
            assert stored(db, r) == r.history, (s, r)


def test_the_new_prompts_of_many_sessions_are_few_statements() -> None:
    # executemany ran (and released and re-took the GIL) once per row: under load the
    # store thread waited for the interpreter's switch interval each time
    db, writer = database(), sh.HistoryWriter(1000)
    first = [record(f"s{i}", ["p0"], 1, i + 1) for i in range(100)]
    writer.write(db, first)
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    writer.write(db, [record(f"s{i}", ["p0", "p1"], 2, i + 1) for i in range(100)])
    db.set_trace_callback(None)
    inserts = [s for s in statements if s.startswith("INSERT")]
    assert len(inserts) == len(chunk_sizes(100)) == 3  # 64 + 32 + 4 rows, not 100 statements
    assert db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == 200
