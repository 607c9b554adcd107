"""What a batch of the SQLite store's writes becomes (sans thread): which writes still
matter (:func:`live_writes`), their rows and statements, and the trims' statements.
The store thread (``sqlite.py``) runs them in one transaction per batch."""

from __future__ import annotations

import itertools
import logging
import sqlite3
from typing import Any

import orjson

from xwm_bridge.observability.logging import capped
from xwm_bridge.store import sqlite_history
from xwm_bridge.store.base import LedgerEntry, SessionRecord, StoreCounters, StoreLimits
from xwm_bridge.store.records import TURNS_PER_SESSION, PermissionRecord, TurnRecord
from xwm_bridge.store.sqlite_rows import batch_rows
from xwm_bridge.store.sqlite_schema import SESSION_COLUMNS

log = logging.getLogger("xwm_bridge.store")

#: a queued operation: its kind, then its arguments
Op = tuple[Any, ...]
#: the kinds of operation that are writes (the others: ``call``, ``stop``)
WRITES = frozenset({"save", "append", "delete", "turn", "perm", "unperm"})
#: per session the newest turns are kept (store.records.TURNS_PER_SESSION)
TRIM_TURNS = (
    "DELETE FROM turns WHERE session_id = ? AND turn_id NOT IN (SELECT turn_id FROM turns"
    " WHERE session_id = ? ORDER BY started_at DESC, turn_id DESC LIMIT ?)"
)
#: delete a session's rows older than its oldest row holding an entry in the newest
#: ``cap`` (event id ``top - cap + 1`` or later): event ids rise with ``id`` within a
#: session, so those rows hold only older entries. The subquery walks the session's
#: rows oldest first and stops at the first one kept, so a trim reads the rows it
#: deletes and one more, not every row of the session (which, with many sessions
#: interleaved in the table, meant a page read per row past the page cache)
TRIM_OLDER = (
    "DELETE FROM ledger WHERE session_id = ? AND id < (SELECT id FROM ledger"
    " WHERE session_id = ? AND event_id > 0 AND event_id + count > ? ORDER BY id LIMIT 1)"
)
#: the largest entry a session holds
LARGEST_ENTRY = "SELECT MAX(length(message)) FROM ledger WHERE session_id = ?"
#: drop a session's oldest entries past ``ledger_max_bytes`` (the newest that fit stay,
#: and the newest one always)
TRIM_BYTES = (
    "DELETE FROM ledger WHERE session_id = ? AND id <= (SELECT MAX(id) FROM"
    " (SELECT id, SUM(length(message)) OVER (ORDER BY id DESC) AS total,"
    " ROW_NUMBER() OVER (ORDER BY id DESC) AS rn FROM ledger WHERE session_id = ?)"
    " WHERE total > ? AND rn > 1)"
)


def forget_oldest(
    db: sqlite3.Connection,
    limit: int,
    limits: StoreLimits,
    untrimmed: dict[str, int],
    untrimmed_bytes: dict[str, int],
    untrimmed_turns: dict[str, int],
    largest: dict[str, int],
) -> None:
    """Keep the store thread's per-session counters to ``limit`` sessions each: past
    it, the oldest half of the tracked sessions is trimmed now and forgotten."""
    if len(untrimmed) > limit:
        for sid in list(itertools.islice(untrimmed, len(untrimmed) // 2)):
            del untrimmed[sid]
            untrimmed_bytes.pop(sid, None)
            trim_ledger(db, sid, 0, 0, limits, largest)
    if len(untrimmed_turns) > limit:
        for sid in list(itertools.islice(untrimmed_turns, len(untrimmed_turns) // 2)):
            del untrimmed_turns[sid]
            db.execute(TRIM_TURNS, (sid, sid, TURNS_PER_SESSION))
    if len(largest) > limit:  # forgotten: one full trim next time
        for sid in list(itertools.islice(largest, len(largest) // 2)):
            del largest[sid]


def trim_ledger(
    db: sqlite3.Connection,
    sid: str,
    top: int,
    added_largest: int,
    limits: StoreLimits,
    largest: dict[str, int],
) -> None:
    """Bring a session's ledger rows to its bounds (in the caller's transaction).
    ``top``: its newest event id if known (else 0); ``added_largest``: the largest
    entry just appended; ``largest``: per session, the largest entry it holds, when
    known (updated)."""
    cap, max_bytes = limits.ledger_max_entries, limits.ledger_max_bytes
    db.execute(  # the newest `cap` rows hold at least `cap` entries
        "DELETE FROM ledger WHERE session_id = ? AND id <= (SELECT id FROM ledger"
        " WHERE session_id = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
        (sid, sid, cap),
    )
    if top > cap:  # rows whose entries are all older than the newest `cap`
        db.execute(TRIM_OLDER, (sid, sid, top - cap + 1))
    known = largest.get(sid)
    biggest = max(known or 0, added_largest)
    if known is None or cap * biggest > max_bytes:
        # the window query reads every entry of the session: only when the count
        # bound alone may not keep the byte bound
        db.execute(TRIM_BYTES, (sid, sid, max_bytes))
        row = db.execute(LARGEST_ENTRY, (sid,)).fetchone()
        biggest = int(row[0] or 0)  # of the entries left
    largest[sid] = biggest


def session_of(op: Op) -> str:
    target = op[1] if len(op) > 1 else ""
    return str(getattr(target, "session_id", target))


def live_writes(writes: list[Op]) -> set[int]:
    """Indexes of the writes that still matter: a save is dead when a later save or
    delete of the same session follows in the batch (a save replaces the whole row),
    a ledger append, turn record or permission write when a later delete does, a turn
    record when a later record of the same turn does. Saves are typically two per turn
    (turn start and end) and a thread's next turn starts right after, so about half go."""
    live: set[int] = set()
    saved: set[str] = set()
    deleted: set[str] = set()
    turns: set[tuple[str, str]] = set()
    for i in range(len(writes) - 1, -1, -1):
        op = writes[i]
        kind = op[0]
        if kind == "save":
            sid = op[1].session_id
            if sid not in saved and sid not in deleted:
                live.add(i)
            saved.add(sid)
        elif kind == "append":
            if op[1] not in deleted:
                live.add(i)
        elif kind == "delete":
            live.add(i)
            deleted.add(op[1])
        elif kind == "turn":
            key = (op[1].session_id, op[1].turn_id)
            if key not in turns and key[0] not in deleted:
                live.add(i)
            turns.add(key)
        else:  # permission records ("perm" carries the record, "unperm" the session id)
            sid = op[1] if kind == "unperm" else op[1].session_id
            if sid not in deleted:
                live.add(i)
    return live


def ledger_top(db: sqlite3.Connection, session_id: str) -> tuple[int, int]:
    """The highest bridge seq and event id in a session's ledger."""
    row = db.execute(
        "SELECT MAX(pos), MAX(event_id + count - 1) FROM ledger WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if not row or row[0] is None:
        return 0, 0
    return int(row[0]) // 2, int(row[1])


UPSERT_SESSION = (
    f"INSERT OR REPLACE INTO sessions ({SESSION_COLUMNS}) VALUES ({', '.join('?' * 13)})"
)
INSERT_ENTRY = (
    "INSERT INTO ledger (session_id, pos, turn_id, message, ts, event_id, kind, count)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
UPSERT_TURN = (
    "INSERT OR REPLACE INTO turns (session_id, turn_id, started_at, body) VALUES (?, ?, ?, ?)"
)


def session_row(r: SessionRecord) -> tuple[Any, ...]:
    """The ``sessions`` row (its history goes to ``history``: HistoryWriter)."""
    start, end = sqlite_history.span(r)
    return (
        r.session_id,
        r.thread_id,
        r.provider,
        b"[]",
        r.seq,
        r.last_turn_id,
        r.last_turn_status,
        orjson.dumps(r.upstream),
        r.updated_at,
        r.events,
        r.owner,
        start,
        end,
    )


def entry_row(session_id: str, e: LedgerEntry) -> tuple[Any, ...]:
    return (session_id, e.pos, e.turn_id, orjson.dumps(e.message), e.ts, e.event_id, e.kind, 1)


def append_rows(
    session_id: str,
    payload: LedgerEntry | tuple[LedgerEntry, ...],
    bad: list[tuple[Op, Exception]],
) -> list[tuple[tuple[Any, ...], list[int]]]:
    """The ledger rows of one ``append`` op; an entry that cannot be encoded is
    left out and added to ``bad`` (the others are kept)."""
    encoded: list[tuple[LedgerEntry, bytes]] = []
    for entry in payload if isinstance(payload, tuple) else (payload,):
        try:
            encoded.append((entry, orjson.dumps(entry.message)))
        except TypeError as exc:  # e.g. nested deeper than orjson writes
            bad.append((("append", session_id, entry), exc))
    return batch_rows(session_id, encoded) if encoded else []


def turn_row(t: TurnRecord) -> tuple[Any, ...]:
    return (t.session_id, t.turn_id, t.started_at, t.dumps())


def upsert(db: sqlite3.Connection, r: SessionRecord) -> None:
    db.execute(UPSERT_SESSION, session_row(r))


def insert_entry(db: sqlite3.Connection, session_id: str, e: LedgerEntry) -> None:
    db.execute(INSERT_ENTRY, entry_row(session_id, e))


def delete(db: sqlite3.Connection, session_id: str) -> None:
    db.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM ledger WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM turns WHERE session_id = ?", (session_id,))
    db.execute("DELETE FROM permissions WHERE session_id = ?", (session_id,))
    db.execute(sqlite_history.DELETE_ALL, (session_id,))


def apply_permission(db: sqlite3.Connection, op: Op) -> None:
    """Pending permission requests (issue 13)."""
    if op[0] == "perm":
        p: PermissionRecord = op[1]
        db.execute(
            "INSERT OR REPLACE INTO permissions VALUES (?, ?, ?, ?)",
            (p.session_id, p.request_id, p.created_at, p.dumps()),
        )
    else:
        db.execute(
            "DELETE FROM permissions WHERE session_id = ? AND request_id = ?", (op[1], op[2])
        )


#: SQLite's primary result codes of a database that cannot serve for now: busy or
#: locked, out of memory, read-only, an I/O error, damaged, full, cannot be opened, its
#: lock protocol failing, not a database (https://sqlite.org/rescode.html). Extended
#: codes (``SQLITE_IOERR_WRITE``, ``SQLITE_READONLY_DBMOVED``…) carry theirs in the low
#: byte. CPython raises ``SQLITE_NOMEM`` as a ``MemoryError``, without a code.
OUTAGE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOTADB,
    }
)
#: what one write's own values cause (a constraint, a value SQLite or the encoder
#: cannot take): that write is a bad record, dropped alone
RECORD_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.DataError,
    sqlite3.InterfaceError,
    sqlite3.ProgrammingError,
    OverflowError,
    TypeError,
    ValueError,
)


def refused(exc: BaseException) -> bool:
    """Whether an error is the database's refusal, an outage rather than a bad record or
    a bug: an ``sqlite3`` error whose result code (``sqlite_errorcode``) is one of
    :data:`OUTAGE_CODES` (locked, disk full or failing, read-only file, a damaged file).
    ``OperationalError`` is also what ``no such table``, ``no such column`` and a syntax
    error raise (``SQLITE_ERROR``: our SQL, or a schema this version does not know): a
    bug, as is an error without a code (raised by the driver, not by SQLite)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and isinstance(code, int) and code & 0xFF in OUTAGE_CODES


def dropped(
    ops: list[Op], exc: Exception, counters: StoreCounters, *, traceback: bool = True
) -> None:
    """Count and log writes the store gave up: the backend refused them or a bug failed
    them (a failed write, ``/readyz`` unready for a while; a bug is logged with its
    traceback unless ``traceback`` is false: one per error of a batch) or they are bad
    records (dropped alone)."""
    outage = refused(exc)
    record = not outage and isinstance(exc, RECORD_ERRORS)
    if record:
        counters.bad_records += len(ops)
    else:
        counters.write_errors += len(ops)
        counters.failed(str(exc))
    bug = not outage and not record
    log.error(
        "session store dropped a record" if record else "session store write failed; dropped",
        exc_info=exc if bug and traceback else None,
        extra={
            "ops": len(ops),
            "op": ops[0][0],
            "session_id": session_of(ops[0])[:128],
            "error": capped(f"{type(exc).__name__}: {exc}", 300),
        },
    )
