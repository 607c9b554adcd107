"""Opening the store's database (``store/sqlite_schema.py``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from xwm_bridge.store import sqlite_schema


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
