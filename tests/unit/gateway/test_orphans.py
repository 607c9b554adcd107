"""The runs a lost socket left, kept for their abort: bounded, oldest given up first."""

from __future__ import annotations

import logging

import pytest

from xwm_bridge.gateway.orphans import Orphans


def test_past_the_limit_the_oldest_run_is_given_up_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orphans = Orphans("rt-1", limit=3)
    with caplog.at_level(logging.WARNING, logger="xwm_bridge.gateway"):
        for i in range(5):
            orphans.add("agent:main:main", f"run-{i}")
    assert len(orphans) == 3
    given_up = [r.run_id for r in caplog.records if "left running" in r.getMessage()]  # type: ignore[attr-defined]
    assert given_up == ["run-0", "run-1"]
    assert orphans.take() == [("agent:main:main", f"run-{i}") for i in (2, 3, 4)]
    assert len(orphans) == 0 and orphans.take() == []


def test_a_run_added_twice_is_kept_once() -> None:
    orphans = Orphans("rt-1")
    orphans.add("k", "run-1")
    orphans.add("k", "run-1")
    assert orphans.take() == [("k", "run-1")]
