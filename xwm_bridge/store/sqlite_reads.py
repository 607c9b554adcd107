"""The SQLite store's reads as functions of a connection (sans store thread): a record
with its ledger's top, a ledger's entries, a session's turns, a page of sessions, the
pending permission requests; and the two maintenance passes run like reads, the
start-up recovery of ``running`` turns and the retention prune. The store thread
(``sqlite.py``) runs them after the writes queued before them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from xwm_bridge.store import sqlite_history
from xwm_bridge.store.base import (
    RUNNING,
    LedgerEntry,
    SessionRecord,
    StoreLimits,
    interrupted_turn,
    recovered,
)
from xwm_bridge.store.records import (
    TURNS_PER_SESSION,
    PermissionRecord,
    SessionPage,
    SessionQuery,
    TurnRecord,
)
from xwm_bridge.store.sqlite_rows import read_ledger
from xwm_bridge.store.sqlite_schema import SESSION_COLUMNS
from xwm_bridge.store.sqlite_writes import (
    UPSERT_TURN,
    delete,
    insert_entry,
    ledger_top,
    turn_row,
    upsert,
)


def row_to_record(db: sqlite3.Connection, row: tuple[Any, ...]) -> SessionRecord:
    """The record of a ``sessions`` row, its history read from ``history``."""
    sid, thread, provider, _, seq, turn_id, status, upstream, updated, events, owner = row[:11]
    start, end = int(row[11]), int(row[12])
    return SessionRecord(
        session_id=sid,
        thread_id=thread,
        provider=provider,
        history=sqlite_history.read(db, sid, start, end),
        prompts=end,
        seq=int(seq),
        last_turn_id=turn_id,
        last_turn_status=status,
        upstream=tuple((str(k), str(v)) for k, v in orjson.loads(upstream)),
        updated_at=float(updated),
        events=int(events),
        owner=owner,
    )


def record(db: sqlite3.Connection, session_id: str) -> SessionRecord | None:
    """The session's record, its ``seq`` and ``events`` at least its ledger's top."""
    row = db.execute(
        f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    if row is None:
        return None
    found = row_to_record(db, row)
    top, events = ledger_top(db, session_id)
    if top > found.seq or events > found.events:
        found = replace(found, seq=max(top, found.seq), events=max(events, found.events))
    return found


def ledger(
    db: sqlite3.Connection,
    session_id: str,
    after_seq: int,
    limit: int,
    after_event: int | None,
    horizon: float,
    cap: int,
    max_bytes: int,
) -> list[LedgerEntry]:
    """The first ``limit`` entries after the cursor of the replay window
    (:func:`sqlite_rows.read_ledger`: the newest ``cap`` entries within ``max_bytes``,
    none older than ``horizon``)."""
    entries = read_ledger(db, session_id, after_seq, after_event, horizon, cap, max_bytes)
    return entries[:limit]


def recover(db: sqlite3.Connection) -> list[str]:
    """At start: every session whose turn was ``running`` gets it interrupted (its
    record, an interrupted entry in its ledger, its turn record); every pending
    permission request is deleted (their turns died with the process). The ids of the
    sessions fixed. One transaction (the connection is in autocommit mode, where
    ``with db`` alone begins none): a write that fails leaves every turn ``running``
    for the next start, not a record interrupted without its turn record or entry."""
    ids = []
    with db:
        db.execute("BEGIN IMMEDIATE")
        rows = db.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE last_turn_status = ?", (RUNNING,)
        ).fetchall()
        db.execute("DELETE FROM permissions")  # their turns died with the process
        for row in rows:
            found = row_to_record(db, row)
            fixed, entry = recovered(found, *ledger_top(db, found.session_id))
            upsert(db, fixed)
            insert_entry(db, found.session_id, entry)
            body = db.execute(
                "SELECT body FROM turns WHERE session_id = ? AND turn_id = ?",
                (found.session_id, found.last_turn_id),
            ).fetchone()
            stored = TurnRecord.loads(body[0]) if body else None
            db.execute(UPSERT_TURN, turn_row(interrupted_turn(found, stored)))
            ids.append(found.session_id)
    return ids


def prune(
    db: sqlite3.Connection, now: float, limits: StoreLimits, forget: Callable[[str], None]
) -> int:
    """Delete the sessions not updated within ``limits.retention`` of ``now`` (each
    passed to ``forget`` once deleted; not one whose turn is running: a turn may last
    longer than the retention), ledger entries older than
    ``limits.ledger_max_age`` and the turn records of sessions gone; how many sessions
    were deleted. One transaction, as :func:`recover`: a delete that fails leaves every
    stale session whole for the next prune."""
    with db:
        db.execute("BEGIN IMMEDIATE")
        stale = [
            r[0]
            for r in db.execute(
                "SELECT session_id FROM sessions WHERE updated_at < ? AND last_turn_status != ?",
                (now - limits.retention, RUNNING),
            )
        ]
        for sid in stale:
            delete(db, sid)
        db.execute("DELETE FROM ledger WHERE ts < ?", (now - limits.ledger_max_age,))
        db.execute("DELETE FROM turns WHERE session_id NOT IN (SELECT session_id FROM sessions)")
    for sid in stale:
        forget(sid)
    return len(stale)


def turns(db: sqlite3.Connection, session_id: str, limit: int) -> list[TurnRecord]:
    """The session's newest ``limit`` turn records (at most
    :data:`TURNS_PER_SESSION`), oldest first."""
    rows = db.execute(
        "SELECT body FROM turns WHERE session_id = ?"
        " ORDER BY started_at DESC, turn_id DESC LIMIT ?",
        (session_id, min(max(0, limit), TURNS_PER_SESSION)),  # rows trim lazily
    ).fetchall()
    return [TurnRecord.loads(r[0]) for r in reversed(rows)]


def session_sql(query: SessionQuery) -> tuple[str, list[Any]]:
    """The statement of a page of ``query`` and its parameters (no database: built
    before the read is queued): the page's rows and one more, newest ``updated_at``
    first, each with its last turn's body."""
    where: list[str] = ["1 = 1"]
    args: list[Any] = []
    if query.state == "idle":
        where.append("s.last_turn_status != 'running'")
    elif query.state:
        where.append("s.last_turn_status = ?")
        args.append(query.state)
    for column, value in (("s.provider", query.provider), ("s.thread_id", query.thread_id)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if query.updated_since:
        where.append("s.updated_at >= ?")
        args.append(query.updated_since)
    if query.owner is not None:  # unowned sessions (from before owners) are anyone's
        where.append("s.owner IN ('', ?)")
        args.append(query.owner)
    if query.after is not None:
        where.append("(s.updated_at < ? OR (s.updated_at = ? AND s.session_id < ?))")
        args += [query.after[0], query.after[0], query.after[1]]
    for key, wanted in query.upstream:  # the upstream ids: a JSON list of [key, value]
        pair = "json_extract(j.value, '$[0]') = ?"
        args.append(key)
        if wanted is not None:
            pair += " AND json_extract(j.value, '$[1]') = ?"
            args.append(wanted)
        where.append(f"EXISTS (SELECT 1 FROM json_each(CAST(s.upstream AS TEXT)) j WHERE {pair})")
    sql = (
        f"SELECT {', '.join('s.' + c.strip() for c in SESSION_COLUMNS.split(','))}, t.body"
        " FROM sessions s LEFT JOIN turns t"
        " ON t.session_id = s.session_id AND t.turn_id = s.last_turn_id"
        f" WHERE {' AND '.join(where)}"
        " ORDER BY s.updated_at DESC, s.session_id DESC LIMIT ?"
    )
    args.append(query.limit + 1)
    return sql, args


def session_page(db: sqlite3.Connection, sql: str, args: list[Any], limit: int) -> SessionPage:
    """Run a :func:`session_sql` statement: at most ``limit`` records with their last
    turns, and the cursor of the next page if its one extra row came back."""
    rows = db.execute(sql, args).fetchall()
    items = [
        (row_to_record(db, r[:-1]), TurnRecord.loads(r[-1]) if r[-1] else None)
        for r in rows[:limit]
    ]
    more = len(rows) > limit and items
    last = items[-1][0] if more else None
    return SessionPage(items, (last.updated_at, last.session_id) if last else None)


def permissions(db: sqlite3.Connection) -> list[PermissionRecord]:
    """Every stored pending request, oldest first."""
    rows = db.execute("SELECT body FROM permissions ORDER BY created_at, request_id").fetchall()
    return [PermissionRecord.loads(r[0]) for r in rows]
