"""Opening the store's database (``store/sqlite_schema.py``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from xwm_bridge.store import sqlite_history, sqlite_schema


def test_a_connection_whose_open_fails_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was left open for the garbage collector when a pragma or the migration failed."""
    opened: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def tracking(*args: object, **kwargs: object) -> sqlite3.Connection:
        db = real_connect(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(db)
        return db

    def failing(db: sqlite3.Connection) -> None:
        raise sqlite3.DatabaseError("file is not a database")

    monkeypatch.setattr(sqlite_schema.sqlite3, "connect", tracking)
    monkeypatch.setattr(sqlite_schema, "migrate", failing)
    with pytest.raises(sqlite3.DatabaseError):
        sqlite_schema.connect(tmp_path / "sessions.db")
    assert len(opened) == 1
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        opened[0].execute("SELECT 1")


def test_a_new_file_opens_at_the_current_layout(tmp_path: Path) -> None:
    db = sqlite_schema.connect(tmp_path / "sessions.db")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        assert version == sqlite_schema.SCHEMA_VERSION
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


#: ``history`` as layout 4 made it
HISTORY_4 = """
CREATE TABLE history (
    session_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    prompt TEXT NOT NULL,
    PRIMARY KEY (session_id, n)
) WITHOUT ROWID;
"""


def table_sql(db: sqlite3.Connection, name: str) -> str:
    row = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    return str(row[0]) if row else ""


def test_a_layout_4_history_moves_to_a_rowid_table(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    sqlite_schema.connect(path).close()  # a current file, then made to look like layout 4
    db = sqlite3.connect(path)
    db.executescript(f"DROP TABLE history; {HISTORY_4} PRAGMA user_version = 4;")
    rows = [("a", n, f"prompt {n} \u00e9") for n in range(3, 7)] + [("b", 0, "only")]
    db.executemany("INSERT INTO history VALUES (?, ?, ?)", rows)
    db.commit()
    db.close()
    db = sqlite_schema.connect(path)
    try:
        assert db.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION == 5
        assert "WITHOUT ROWID" not in table_sql(db, "history").upper()
        assert table_sql(db, "history_4") == ""
        moved = db.execute("SELECT session_id, n, prompt FROM history ORDER BY rowid")
        assert moved.fetchall() == sorted(rows)
        assert sqlite_history.read(db, "a", 4, 6) == ("prompt 4 \u00e9", "prompt 5 \u00e9")
        with pytest.raises(sqlite3.IntegrityError):  # (session_id, n) stays unique
            db.execute("INSERT INTO history VALUES ('a', 4, 'again')")
    finally:
        db.close()
    db = sqlite_schema.connect(path)  # opened again: nothing left to migrate
    try:
        assert db.execute("SELECT COUNT(*) FROM history").fetchone()[0] == len(rows)
    finally:
        db.close()


def test_a_new_file_has_a_rowid_history_table(tmp_path: Path) -> None:
    db = sqlite_schema.connect(tmp_path / "sessions.db")
    try:
        assert "WITHOUT ROWID" not in table_sql(db, "history").upper()
    finally:
        db.close()
