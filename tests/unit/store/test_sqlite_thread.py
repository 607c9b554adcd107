"""The store thread's per-batch bookkeeping (``store/sqlite_thread.py``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.store.base import RESULT, LedgerEntry
from xwm_bridge.store.records import TurnRecord
from xwm_bridge.store.sqlite import SQLiteStore
from xwm_bridge.store.sqlite_thread import tally

rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 50),
        st.integers(0, 10**6),
        st.integers(0, 10**5),
        st.integers(-2, 10**6),
    ),
    max_size=40,
)


@given(rows)
def test_tally_is_the_per_session_sums_and_maxima(
    batch: list[tuple[str, int, int, int, int]],
) -> None:
    appended: dict[str, list[int]] = {}
    for sid, entries, size, largest, top in batch:
        tally(appended, sid, entries, size, largest, top)
    expected = {
        sid: [
            sum(r[1] for r in batch if r[0] == sid),
            sum(r[2] for r in batch if r[0] == sid),
            max([0] + [r[3] for r in batch if r[0] == sid]),
            max([0] + [r[4] for r in batch if r[0] == sid]),
        ]
        for sid in {r[0] for r in batch}
    }
    assert appended == expected
    assert list(appended) == list(dict.fromkeys(r[0] for r in batch))  # first-seen order


async def test_one_appended_entry_is_the_row_append_many_writes(tmp_path: Path) -> None:
    """append() builds its row in the thread's batch loop; append_many() of the same one
    entry goes through append_rows: the same row."""
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        entry = LedgerEntry(7, "turn-3", {"result": {"text": "h\u00e9"}}, 1234.5, 9, RESULT)
        store.append("one", entry)
        store.append_many("many", [entry])
        got = await store._call(
            lambda db: db.execute(
                "SELECT session_id, pos, turn_id, message, ts, event_id, kind, count FROM ledger"
                " ORDER BY id"
            ).fetchall()
        )
        same = (7, "turn-3", b'{"result":{"text":"h\xc3\xa9"}}', 1234.5, 9, RESULT, 1)
        assert got == [("one", *same), ("many", *same)]
    finally:
        await store.close()


async def test_a_failed_batch_leaves_the_trim_counters_as_they_were(tmp_path: Path) -> None:
    """A batch that fails after its trim counters were added up is rolled back and
    applied again write by write: its entries are counted once, not twice (a doubled
    count trimmed ledgers and turn records early)."""
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        real_forget = store._forget
        failures = []

        def forget_failing_once(db: sqlite3.Connection) -> None:
            if not failures:
                failures.append(1)
                raise RuntimeError("a bug late in the transaction")
            real_forget(db)

        store._forget = forget_failing_once  # type: ignore[method-assign]
        for pos in (1, 2):  # queued together: one batch, then isolated write by write
            store.append("s", LedgerEntry(pos, "turn-1", {"result": {}}, 1.0, pos, RESULT))
        store.save_turn(TurnRecord(session_id="s", turn_id="turn-1", status="completed"))
        rows = await store._call(
            lambda db: db.execute("SELECT count(*) FROM ledger WHERE session_id='s'").fetchone()
        )
        assert failures == [1]  # the batch did fail once
        assert rows == (2,)  # and nothing was lost
        assert store._untrimmed == {"s": 2}
        assert store._untrimmed_turns == {"s": 1}
    finally:
        await store.close()
