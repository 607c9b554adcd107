"""Prompt history in its own SQLite table: a save writes the prompts it adds, not all.

Layout 4, 5 (``sqlite_schema.py``). A session's history was a JSON array in its
``sessions`` row, rewritten by every save: up to 64 prompts and
``store.history_max_bytes`` (1 MiB) per turn. Now each prompt is one row of
``history``, numbered by its place among all the prompts the session has had
(``SessionRecord.prompts`` counts them), and the session row says which of them
are its history: ``history_from`` ≤ n < ``prompts``.

:class:`HistoryWriter` (store thread only) remembers, per session, which rows
the table holds for which ``Session`` object (``SessionRecord.history_id``): a
save of the same object writes only the prompts added since its last save, any
other save (a restored session, a reset one, a session the writer has
forgotten) rewrites the session's rows once. Rows below ``history_from`` are
deleted every :data:`TRIM_EVERY` prompts; readers never see them.

Layout 5: ``history`` is a rowid table (rows in the order they were written) with a
unique index on ``(session_id, n)``; in layout 4 it was a ``WITHOUT ROWID`` table
clustered by that key. With prompts of a KiB or more, only three or four rows fit a
4 KiB page of the clustered tree, so nearly every insert among the interleaved
sessions split a page and the commit wrote several of them: a store-thread driver
(64 sessions, 1 KiB prompts) measured a third of the thread's CPU per turn less
with the rowid table, and a smaller file (the index holds ~30-byte entries).
"""

from __future__ import annotations

import itertools
import sqlite3
from dataclasses import dataclass

from xwm_bridge.store.base import SessionRecord
from xwm_bridge.store.sqlite_rows import insert_many

SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    session_id TEXT NOT NULL,
    n INTEGER NOT NULL,
    prompt TEXT NOT NULL,
    UNIQUE (session_id, n)
);
"""
INSERT = "INSERT OR REPLACE INTO history (session_id, n, prompt) VALUES (?, ?, ?)"
DELETE_OUTSIDE = "DELETE FROM history WHERE session_id = ? AND (n < ? OR n >= ?)"
DELETE_BELOW = "DELETE FROM history WHERE session_id = ? AND n < ?"
DELETE_ALL = "DELETE FROM history WHERE session_id = ?"
SELECT = "SELECT prompt FROM history WHERE session_id = ? AND n >= ? AND n < ? ORDER BY n"
#: rows below a session's history are deleted once this many have gathered
TRIM_EVERY = 8


def span(record: SessionRecord) -> tuple[int, int]:
    """The numbers of ``record.history``'s first prompt and one past its last."""
    end = max(record.prompts, len(record.history))
    return end - len(record.history), end


def read(db: sqlite3.Connection, session_id: str, start: int, end: int) -> tuple[str, ...]:
    return tuple(r[0] for r in db.execute(SELECT, (session_id, start, end)))


@dataclass(slots=True)
class _Known:
    history_id: int
    low: int  # no row below this number
    end: int  # rows [start of the last save, end) hold that save's history


class HistoryWriter:
    """What the ``history`` table holds per session, as far as this thread wrote it;
    at most ``max_tracked`` sessions (the oldest half is forgotten past it)."""

    def __init__(self, max_tracked: int) -> None:
        self._max = max_tracked
        self._known: dict[str, _Known] = {}

    def write(self, db: sqlite3.Connection, records: list[SessionRecord]) -> None:
        """Bring the table to ``records``' histories (in the caller's transaction)."""
        rows: list[tuple[str, int, str]] = []
        for r in records:
            sid = r.session_id
            start, end = span(r)
            known = self._known.get(sid)
            if known is None or not r.history_id or known.history_id != r.history_id:
                db.execute(DELETE_OUTSIDE, (sid, start, end))
                first = start
                known = self._known[sid] = _Known(r.history_id, start, end)
            else:
                first = max(known.end, start)
                if start - known.low >= TRIM_EVERY:
                    db.execute(DELETE_BELOW, (sid, start))
                    known.low = start
                known.end = end
            history = r.history
            rows += [(sid, n, history[n - start]) for n in range(first, end)]
        if rows:  # few multi-row statements: executemany takes the GIL back per row
            insert_many(db, INSERT, rows)
        if len(self._known) > self._max:
            for sid in list(itertools.islice(self._known, len(self._known) // 2)):
                del self._known[sid]

    def forget(self, session_id: str) -> None:
        """The session's rows are gone (deleted with it)."""
        self._known.pop(session_id, None)

    def clear(self) -> None:
        """A transaction failed: what the table holds is no longer known."""
        self._known.clear()
