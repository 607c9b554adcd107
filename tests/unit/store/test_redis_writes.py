"""xwm_bridge.store.redis_writes: the pipeline commands of a batch of writes (no Redis)."""

from __future__ import annotations

from typing import Any

import orjson

from xwm_bridge.store.base import RUNNING, LedgerEntry, SessionRecord, StoreLimits
from xwm_bridge.store.records import TurnRecord
from xwm_bridge.store.redis_writes import APPEND, SAVE, SAVE_TURN, Commands, Op


class Pipe:
    """Records the commands queued on it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args: self.calls.append((name, args))


def commands(dropped: list[tuple[str, str]] | None = None) -> Commands:
    seen = dropped if dropped is not None else []
    return Commands("x:", StoreLimits(), "r1", lambda kind, sid, exc: seen.append((kind, sid)))


def entry(pos: int, event_id: int, message: Any = None) -> LedgerEntry:
    return LedgerEntry(pos, "turn-1", {"pos": pos} if message is None else message, 1.0, event_id)


def test_a_run_of_appends_is_one_command_per_session() -> None:
    pipe = Pipe()
    writes: list[Op] = [
        ("append", "a", entry(2, 1)),
        ("append", "b", entry(2, 1)),
        ("append", "a", entry(3, 2)),
        ("delete", "c"),
        ("append", "a", entry(5, 3)),
    ]
    commands().batch(pipe, writes)
    evals = [(c[1][0], c[1][2]) for c in pipe.calls if c[0] == "eval"]
    assert evals == [(APPEND, "x:l:a"), (APPEND, "x:l:b"), (APPEND, "x:l:a")]
    first = next(c[1] for c in pipe.calls if c[0] == "eval")
    # cap, ttl, seq (pos // 2), event id, max bytes, then the two entries
    assert first[4:7] == (512, 7 * 86400, 1) and first[7] == 2 and len(first[9:]) == 2
    assert [orjson.loads(i)["e"] for i in first[9:]] == [1, 2]
    names = [c[0] for c in pipe.calls]
    assert names == ["eval", "eval", "delete", "srem", "zrem", "eval"]


def test_an_entry_that_cannot_be_encoded_is_dropped_alone() -> None:
    dropped: list[tuple[str, str]] = []
    pipe = Pipe()
    commands(dropped).append(pipe, "a", [entry(2, 1), entry(3, 2, {"bad": {1, 2}}), entry(4, 3)])
    assert dropped == [("append", "a")]
    (name, args), *rest = pipe.calls
    assert name == "eval" and not rest
    assert [orjson.loads(i)["e"] for i in args[9:]] == [1, 3]


def test_a_save_of_a_running_turn_names_this_replica_and_its_fence() -> None:
    pipe = Pipe()
    record = SessionRecord("s1", "t1", last_turn_status=RUNNING, updated_at=100.0)
    commands().save(pipe, record, fence=7)
    ((name, args),) = pipe.calls
    assert name == "eval" and args[0] == SAVE and args[1] == 4
    assert args[2:6] == ("x:fence:t1", "x:s:s1", "x:running", "x:idx")
    assert args[6:11] == (7, int((100.0 + 7 * 86400) * 1000), "s1", "1", 100.0)
    fields = dict(zip(args[11::2], args[12::2], strict=True))
    assert fields["owner"] == "r1"


def test_a_turn_record_that_cannot_be_encoded_is_dropped_alone() -> None:
    dropped: list[tuple[str, str]] = []
    pipe = Pipe()
    good = TurnRecord("s1", "turn-1")
    bad = TurnRecord("s1", "turn-2", result={"x": {1}})
    commands(dropped).batch(pipe, [("turn", bad), ("turn", good)])
    assert dropped == [("turn", "s1")]
    ((name, args),) = pipe.calls
    assert name == "eval" and args[0] == SAVE_TURN and args[2:4] == ("x:t:s1", "turn-1")
