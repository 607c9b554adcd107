"""internal.bench.turncpu: per-turn figures from clock readings and cProfile stats."""

from __future__ import annotations

import cProfile
import pstats

from internal.bench.turncpu import calls_per_turn, per_turn, summary


def test_per_turn_is_microseconds_of_each_clock() -> None:
    got = per_turn({"loop": 1.0, "store": 2.0}, {"loop": 1.5, "store": 2.1}, 1000)
    assert got == {"loop": 500.0, "store": 100.0}


def _turn() -> int:
    return len([1, 2])  # one Python call, one built-in call


def test_calls_per_turn_counts_python_and_built_in_calls() -> None:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        _turn()
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    got = calls_per_turn(stats, 10)
    # each turn: _turn and len, and the profiler's own disable call once in all
    assert got["py_calls"] == 1.0
    assert got["calls"] == 2.1


def test_summary_holds_the_windows_and_the_errors() -> None:
    windows = {"cpu": {"turns": 5, "loop": 1.0}}
    assert summary(windows, 0) == {"cpu": {"turns": 5, "loop": 1.0}, "errors": 0}
