"""How the SQLite store lays out ledger rows and multi-row statements (sans thread).

A ledger row holds ``count`` entries (see ``sqlite_schema.SCHEMA_VERSION``): one, with
its JSON as ``message``, or the frames of one relay batch, with ``message`` a JSON
array of them (same ``pos``, ``turn_id``, ``ts`` and ``kind``; event ids
``event_id``, ``event_id + 1``, …). :func:`batch_rows` builds them,
:func:`read_ledger` reads them back entry by entry within the ledger's bounds.
"""

from __future__ import annotations

import functools
import itertools
import sqlite3
from typing import Any

import orjson

from xwm_bridge.store.base import LedgerEntry, emitted_pos

#: a row's entries' own JSON bytes: a batch row is ``[`` + entries joined by ``,`` + ``]``
ENTRY_BYTES = "(length(message) - CASE WHEN count > 1 THEN count + 1 ELSE 0 END)"


#: rows per multi-row INSERT: each statement is one sqlite3_step, i.e. one release of
#: the GIL, where executemany releases and re-takes it for every row (and the event
#: loop's thread contends for it each time)
ROWS_PER_STATEMENT = 256


@functools.lru_cache(maxsize=64)
def _many(statement: str, rows: int) -> str:
    """``statement`` (one ``VALUES (?, …)`` group) with ``rows`` groups."""
    head, _, group = statement.partition(" VALUES ")
    return f"{head} VALUES {', '.join([group] * rows)}"


def chunk_sizes(rows: int) -> list[int]:
    """Rows per statement for ``rows`` rows: ROWS_PER_STATEMENT while they last, then
    powers of two. Few statement shapes, so SQLite's statement cache (128 by default)
    stays small: a prepared 256-row INSERT is tens of KiB, and one shape per batch
    size kept the daemon's RSS growing by megabytes under many small batches."""
    sizes = [ROWS_PER_STATEMENT] * (rows // ROWS_PER_STATEMENT)
    rest = rows % ROWS_PER_STATEMENT
    bit = ROWS_PER_STATEMENT // 2
    while rest:
        if rest >= bit:
            sizes.append(bit)
            rest -= bit
        bit //= 2
    return sizes


def insert_many(db: sqlite3.Connection, statement: str, rows: list[tuple[Any, ...]]) -> None:
    start = 0
    for size in chunk_sizes(len(rows)):
        chunk = rows[start : start + size]
        start += size
        db.execute(_many(statement, size), list(itertools.chain.from_iterable(chunk)))


def runs_on(prev: LedgerEntry, e: LedgerEntry) -> bool:
    """Whether ``e`` can share ``prev``'s row (see :data:`SCHEMA_VERSION`)."""
    return (
        e.event_id == prev.event_id + 1
        and prev.event_id > 0
        and e.pos == prev.pos
        and e.turn_id == prev.turn_id
        and e.kind == prev.kind
    )


def batch_rows(
    session_id: str, encoded: list[tuple[LedgerEntry, bytes]]
) -> list[tuple[tuple[Any, ...], list[int]]]:
    """Rows for entries appended together, with each row's entry sizes: a run of
    entries that :func:`runs_on` shares one row."""
    if len(encoded) == 1:  # the common case: one entry, one row
        e, raw = encoded[0]
        return [((session_id, e.pos, e.turn_id, raw, e.ts, e.event_id, e.kind, 1), [len(raw)])]
    out: list[tuple[tuple[Any, ...], list[int]]] = []
    start = 0
    for end in range(1, len(encoded) + 1):
        if end < len(encoded) and runs_on(encoded[end - 1][0], encoded[end][0]):
            continue
        run = encoded[start:end]
        first = run[0][0]
        raw = run[0][1] if len(run) == 1 else b"[" + b",".join(r for _, r in run) + b"]"
        row = (session_id, first.pos, first.turn_id, raw, first.ts, first.event_id)
        out.append(((*row, first.kind, len(run)), [len(r) for _, r in run]))
        start = end
    return out


def read_ledger(
    db: sqlite3.Connection,
    session_id: str,
    after_seq: int,
    after_event: int | None,
    horizon: float,
    cap: int,
    max_bytes: int,
) -> list[LedgerEntry]:
    """A session's entries after bridge update ``after_seq`` (or after event
    ``after_event``) no older than ``horizon``, within the ledger's bounds: the
    newest ``cap`` entries that fit in ``max_bytes`` (trimming may lag behind)."""
    if after_event is None:
        where, floor = "pos > ?", emitted_pos(after_seq)
    else:
        where, floor = "event_id + count - 1 > ?", after_event
    # the rows that may hold one of those entries; window() cuts them exactly. The
    # filter drops only older entries, so it may go before the window.
    rows = db.execute(
        "SELECT pos, turn_id, message, ts, event_id, kind, count FROM (SELECT *,"
        " SUM(count) OVER (ORDER BY id DESC) - count AS newer,"
        f" SUM({ENTRY_BYTES}) OVER (ORDER BY id DESC) - {ENTRY_BYTES} AS newer_bytes"
        f" FROM ledger WHERE session_id = ? AND {where} AND ts >= ?)"
        " WHERE newer < ? AND (newer_bytes <= ? OR newer = 0) ORDER BY id",
        (session_id, floor, horizon, cap, max_bytes),
    ).fetchall()
    entries = window(rows, cap, max_bytes)
    if after_event is not None:
        entries = [e for e in entries if e.event_id > after_event]
    return entries


def window(rows: list[tuple[Any, ...]], cap: int, max_bytes: int) -> list[LedgerEntry]:
    """The entries of ``rows`` (oldest first), cut to the newest ``cap`` that fit in
    ``max_bytes`` (an entry's size: its JSON, as a one-entry row holds it), and
    always the newest one."""
    newest_first: list[LedgerEntry] = []
    total = 0
    for pos, turn_id, raw, ts, event_id, kind, count in reversed(rows):
        if count == 1:
            items: list[tuple[Any, int]] = [(orjson.loads(raw), len(raw))]
        else:
            items = [(m, len(orjson.dumps(m))) for m in orjson.loads(raw)]
        for i in range(len(items) - 1, -1, -1):
            message, size = items[i]
            if len(newest_first) >= cap or (newest_first and total + size > max_bytes):
                return newest_first[::-1]
            total += size
            entry = LedgerEntry(int(pos), turn_id, message, float(ts), int(event_id) + i, kind)
            newest_first.append(entry)
    return newest_first[::-1]
