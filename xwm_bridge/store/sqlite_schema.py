"""The SQLite store's layout (sans thread): its tables, the layout version, the
migration of a database of an earlier layout, and the opening of the store thread's
connection (its settings, then that migration)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from xwm_bridge.store import sqlite_history

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    history BLOB NOT NULL,
    seq INTEGER NOT NULL,
    last_turn_id TEXT NOT NULL,
    last_turn_status TEXT NOT NULL,
    upstream BLOB NOT NULL,
    updated_at REAL NOT NULL,
    events INTEGER NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT '',
    history_from INTEGER NOT NULL DEFAULT 0,
    prompts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    turn_id TEXT NOT NULL,
    message BLOB NOT NULL,
    ts REAL NOT NULL,
    event_id INTEGER NOT NULL DEFAULT 0,
    kind TEXT NOT NULL DEFAULT 'notification',
    count INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS ledger_session ON ledger (session_id, id);
CREATE INDEX IF NOT EXISTS ledger_ts ON ledger (ts);
CREATE TABLE IF NOT EXISTS health (k TEXT PRIMARY KEY, v REAL NOT NULL);
CREATE INDEX IF NOT EXISTS sessions_updated ON sessions (updated_at);
CREATE TABLE IF NOT EXISTS turns (
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    started_at REAL NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);
CREATE TABLE IF NOT EXISTS permissions (
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, request_id)
);
"""
#: ``PRAGMA user_version`` of this layout. 0: the first layout (issue 6), whose
#: ledger had no event ids; 1: sessions had no owner (issue 16); 2: one row per
#: entry (no ``count``); 3: the prompt history was a JSON array in the session row
#: (now rows of ``history``: ``sqlite_history.py``); 4: ``history`` was a
#: ``WITHOUT ROWID`` table (now a rowid table with a unique index: ``sqlite_history.py``);
#: :func:`migrate` upgrades it in place on open.
#:
#: A ledger row holds ``count`` entries: one (``message`` is the entry's JSON), or
#: the frames of one relay batch (``message`` is a JSON array of them; they share
#: ``pos``, ``turn_id``, ``ts`` and ``kind``, and have the event ids ``event_id``,
#: ``event_id + 1``, …). A 50-chunk streamed turn is then a handful of rows, not 52.
SCHEMA_VERSION = 5
SESSION_COLUMNS = (
    "session_id, thread_id, provider, history, seq, last_turn_id, last_turn_status,"
    " upstream, updated_at, events, owner, history_from, prompts"
)

#: connection settings past WAL + synchronous=NORMAL (measured in performance.md):
#: statement journals (every multi-row INSERT and upsert inside the batch's
#: transaction) and sorts stay in memory instead of spilling to temp files (an
#: open, writes and an unlink per spill); a checkpoint every 4,000 WAL pages
#: (16 MiB at 4 KiB pages) instead of 1,000 copies a page rewritten by many
#: batches once, and fsyncs a quarter as often
TUNING = ("temp_store=MEMORY", "wal_autocheckpoint=4000")


def connect(path: Path) -> sqlite3.Connection:
    """The store thread's connection (used on the calling thread only): WAL,
    ``synchronous=NORMAL``, :data:`TUNING`, the file at :data:`SCHEMA_VERSION`."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=True)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        for pragma in TUNING:
            db.execute(f"PRAGMA {pragma}")
        migrate(db)
        db.executescript(SCHEMA + sqlite_history.SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        db.close()  # not left open for the garbage collector (the thread reports the error)
        raise
    return db


def migrate(db: sqlite3.Connection) -> None:
    """Bring a database of an earlier layout to :data:`SCHEMA_VERSION`, in one
    transaction. Version 0 → 1: ledger rows get event ids 1, 2, 3, … per session
    in insertion order, and each session its last event id. 1 → 2: sessions get an
    ``owner`` column (empty: unowned). 2 → 3: ledger rows get a ``count`` (1: every
    earlier row holds one entry). 3 → 4: each session's history array becomes rows
    0, 1, … of ``history``. 4 → 5: ``history``'s rows move to a rowid table."""
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version >= SCHEMA_VERSION or not {"sessions", "ledger"} <= tables:
        return  # current, or a new file (SCHEMA creates it)
    with db:
        db.execute("BEGIN IMMEDIATE")
        if version < 1:
            columns = {r[1] for r in db.execute("PRAGMA table_info(ledger)")}
            if "event_id" not in columns:
                db.execute("ALTER TABLE ledger ADD COLUMN event_id INTEGER NOT NULL DEFAULT 0")
                db.execute(
                    "ALTER TABLE ledger ADD COLUMN kind TEXT NOT NULL DEFAULT 'notification'"
                )
            if "events" not in {r[1] for r in db.execute("PRAGMA table_info(sessions)")}:
                db.execute("ALTER TABLE sessions ADD COLUMN events INTEGER NOT NULL DEFAULT 0")
            db.execute(
                "UPDATE ledger SET event_id = (SELECT COUNT(*) FROM ledger AS l"
                " WHERE l.session_id = ledger.session_id AND l.id <= ledger.id)"
                " WHERE event_id = 0"
            )
            db.execute(
                "UPDATE sessions SET events = (SELECT COALESCE(MAX(event_id), 0) FROM ledger"
                " WHERE ledger.session_id = sessions.session_id)"
            )
        # 1 → 2: sessions get an owner; the old ones are unowned (the next turn claims them)
        if "owner" not in {r[1] for r in db.execute("PRAGMA table_info(sessions)")}:
            db.execute("ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
        if "count" not in {r[1] for r in db.execute("PRAGMA table_info(ledger)")}:
            db.execute("ALTER TABLE ledger ADD COLUMN count INTEGER NOT NULL DEFAULT 1")
        if "prompts" not in {r[1] for r in db.execute("PRAGMA table_info(sessions)")}:
            _history_rows(db)
        elif _without_rowid(db, "history"):
            _history_rowid(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _history_rows(db: sqlite3.Connection) -> None:
    """3 → 4 (in the caller's transaction)."""
    db.execute("ALTER TABLE sessions ADD COLUMN history_from INTEGER NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE sessions ADD COLUMN prompts INTEGER NOT NULL DEFAULT 0")
    db.execute(sqlite_history.SCHEMA)
    for sid, blob in db.execute("SELECT session_id, history FROM sessions").fetchall():
        history = [str(p) for p in orjson.loads(blob or b"[]")]
        db.executemany(sqlite_history.INSERT, [(sid, n, p) for n, p in enumerate(history)])
        db.execute(
            "UPDATE sessions SET history = '[]', history_from = 0, prompts = ?"
            " WHERE session_id = ?",
            (len(history), sid),
        )


def _without_rowid(db: sqlite3.Connection, table: str) -> bool:
    row = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row is not None and "WITHOUT ROWID" in str(row[0]).upper()


def _history_rowid(db: sqlite3.Connection) -> None:
    """4 → 5 (in the caller's transaction)."""
    db.execute("ALTER TABLE history RENAME TO history_4")
    db.execute(sqlite_history.SCHEMA)
    db.execute(
        "INSERT INTO history (session_id, n, prompt)"
        " SELECT session_id, n, prompt FROM history_4 ORDER BY session_id, n"
    )
    db.execute("DROP TABLE history_4")
