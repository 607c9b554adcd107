"""xwm_bridge.store.sqlite_rows: batch rows read back exactly as one row per entry would.

The store's own read (``read_ledger``: the window query and ``window``) against a
reference that applies the bounds to the flat list of entries (newest ``cap``
whose own JSON fits in ``max_bytes``, the newest always), for random batches,
sizes and cursors.
"""

from __future__ import annotations

import sqlite3

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.store.base import LedgerEntry, relayed_pos
from xwm_bridge.store.sqlite_rows import (
    ROWS_PER_STATEMENT,
    batch_rows,
    chunk_sizes,
    read_ledger,
)
from xwm_bridge.store.sqlite_schema import SCHEMA
from xwm_bridge.store.sqlite_writes import INSERT_ENTRY

INSERT = INSERT_ENTRY


def reference(entries: list[LedgerEntry], cap: int, max_bytes: int) -> list[int]:
    kept: list[int] = []
    total = 0
    for e in reversed(entries):
        size = len(orjson.dumps(e.message))
        if len(kept) >= cap or (kept and total + size > max_bytes):
            break
        total += size
        kept.append(e.event_id)
    return kept[::-1]


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6),
        min_size=1,
        max_size=8,
    ),
    cap=st.integers(min_value=1, max_value=12),
    max_bytes=st.integers(min_value=1, max_value=300),
    after=st.integers(min_value=0, max_value=30),
)
def test_batch_rows_read_back_as_single_entries(
    batches: list[list[int]], cap: int, max_bytes: int, after: int
) -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    entries: list[LedgerEntry] = []
    event = 0
    for seq, sizes in enumerate(batches, 1):
        batch = []
        for size in sizes:
            event += 1
            batch.append(LedgerEntry(relayed_pos(seq), "t", {"p": "x" * size}, event_id=event))
        encoded = [(e, orjson.dumps(e.message)) for e in batch]
        for row, _ in batch_rows("s", encoded):
            db.execute(INSERT, row)
        entries += batch
    got = [e.event_id for e in read_ledger(db, "s", 0, after, 0.0, cap, max_bytes)]
    want = [i for i in reference(entries, cap, max_bytes) if i > after]
    assert got == want
    assert db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == len(batches)


def test_the_byte_window_counts_entries_not_the_batch_rows_brackets() -> None:
    # eight newer rows of six 1-byte entries: their rows are 56 bytes longer than
    # their entries; the older entry still fits in the entries' bytes
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    event = 1
    db.execute(INSERT, ("s", relayed_pos(0), "t", b"1", 0.0, event, "notification", 1))
    for seq in range(1, 9):
        batch = [LedgerEntry(relayed_pos(seq), "t", 1, event_id=event + i + 1) for i in range(6)]
        event += 6
        for row, _ in batch_rows("s", [(e, b"1") for e in batch]):
            db.execute(INSERT, row)
    kept = read_ledger(db, "s", 0, None, 0.0, 100, 49)
    assert [e.event_id for e in kept] == list(range(1, 50))
    assert read_ledger(db, "s", 0, None, 0.0, 100, 48)[0].event_id == 2


def test_multi_row_statements_come_in_few_shapes() -> None:
    shapes: set[int] = set()
    for rows in range(0, 3 * ROWS_PER_STATEMENT + 1):
        sizes = chunk_sizes(rows)
        assert sum(sizes) == rows and sizes == sorted(sizes, reverse=True)
        shapes.update(sizes)
    # one prepared statement per shape and table stays in SQLite's statement cache
    assert shapes == {2**i for i in range(ROWS_PER_STATEMENT.bit_length())}
