"""xwm_bridge.store.sqlite_writes: which queued writes of one batch still matter (no database)."""

from __future__ import annotations

from xwm_bridge.store.base import LedgerEntry, SessionRecord
from xwm_bridge.store.sqlite_writes import Op, live_writes


def save(sid: str, seq: int) -> Op:
    return ("save", SessionRecord(sid, sid, seq=seq))


def append(sid: str, pos: int) -> Op:
    return ("append", sid, LedgerEntry(pos, "t", {}))


def delete(sid: str) -> Op:
    return ("delete", sid)


def test_only_the_last_save_of_a_session_is_written() -> None:
    ops = [save("a", 1), append("a", 2), save("b", 1), save("a", 2)]
    assert live_writes(ops) == {1, 2, 3}


def test_a_delete_kills_earlier_saves_and_appends_not_later_ones() -> None:
    ops = [save("a", 1), append("a", 2), delete("a"), append("a", 2), save("a", 1)]
    assert live_writes(ops) == {2, 3, 4}


def test_other_sessions_are_untouched() -> None:
    ops = [save("a", 1), delete("b"), append("a", 4), save("b", 9)]
    assert live_writes(ops) == {0, 1, 2, 3}


def turn(sid: str, turn_id: str) -> Op:
    from xwm_bridge.store.records import TurnRecord

    return ("turn", TurnRecord(session_id=sid, turn_id=turn_id))


def test_a_turn_record_is_superseded_by_a_later_one_of_the_same_turn() -> None:
    ops = [turn("a", "t1"), turn("b", "t1"), turn("a", "t1"), turn("a", "t2")]
    assert live_writes(ops) == {1, 2, 3}


def test_permission_writes_never_kill_session_writes() -> None:
    from xwm_bridge.store.records import PermissionRecord

    ops = [
        save("a", 1),
        append("a", 2),
        ("unperm", "a", "p1"),
        ("perm", PermissionRecord("a", "p2")),
    ]
    assert live_writes(ops) == {0, 1, 2, 3}


def test_a_delete_kills_the_sessions_turns_and_permissions_before_it() -> None:
    """So a batch may apply its deletes first, then one executemany per table."""
    from xwm_bridge.store.records import PermissionRecord

    ops = [
        turn("a", "t1"),
        ("perm", PermissionRecord("a", "p1")),
        ("unperm", "a", "p0"),
        delete("a"),
        turn("a", "t2"),
        ("perm", PermissionRecord("b", "p3")),
    ]
    assert live_writes(ops) == {3, 4, 5}


def test_records_serialize_as_their_fields() -> None:
    """dumps() is orjson's native dataclass encoding: the same JSON as asdict(), and
    loads() reads it back whole."""
    from dataclasses import asdict

    import orjson

    from xwm_bridge.store.records import Answerer, PermissionRecord, TurnRecord

    turn = TurnRecord("s", "turn-1", prompt="hi", result={"ok": [1, {"a": None}]}, usage={"n": 1})
    assert orjson.loads(turn.dumps()) == asdict(turn)
    assert TurnRecord.loads(turn.dumps()) == turn
    perm = PermissionRecord("s", "p", options=({"optionId": "x"},), by=Answerer("ws", "1.2.3.4"))
    assert PermissionRecord.loads(perm.dumps()) == perm


def test_an_unencodable_entry_is_left_out_of_the_rows_and_reported() -> None:
    from xwm_bridge.store.sqlite_writes import append_rows

    good = LedgerEntry(2, "t", {"n": 1}, event_id=1)
    nested: dict[str, object] = {}
    deep = nested
    for _ in range(300):  # deeper than orjson writes
        deep["d"] = deep = {}
    bad_entry = LedgerEntry(2, "t", nested, event_id=2)
    bad: list[tuple[Op, Exception]] = []
    rows = append_rows("s", (good, bad_entry), bad)
    assert [sizes for _, sizes in rows] == [[len(b'{"n":1}')]]
    assert [(op, type(exc)) for op, exc in bad] == [(("append", "s", bad_entry), TypeError)]
    assert append_rows("s", bad_entry, []) == []
