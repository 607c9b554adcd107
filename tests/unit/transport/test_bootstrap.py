"""xwm_bridge.transport.bootstrap.RateLimiter: sliding one-minute window, bounded keys."""

from __future__ import annotations

import pytest

from xwm_bridge.transport import bootstrap
from xwm_bridge.transport.bootstrap import RateLimiter


def test_allows_up_to_the_limit_per_window() -> None:
    rl = RateLimiter(3)
    assert [rl.allow("ip", now=100.0 + i) for i in range(5)] == [True, True, True, False, False]


def test_window_slides() -> None:
    rl = RateLimiter(2)
    assert rl.allow("ip", now=0.0)
    assert rl.allow("ip", now=30.0)
    assert not rl.allow("ip", now=59.9)
    assert rl.allow("ip", now=60.0)  # the hit at 0 has left the window
    assert not rl.allow("ip", now=89.9)
    assert rl.allow("ip", now=90.0)  # the hit at 30 has left


def test_refused_requests_do_not_extend_the_block() -> None:
    rl = RateLimiter(1)
    assert rl.allow("ip", now=0.0)
    for t in range(1, 60):
        assert not rl.allow("ip", now=float(t))
    assert rl.allow("ip", now=60.0)


def test_keys_are_independent() -> None:
    rl = RateLimiter(1)
    assert rl.allow("a", now=0.0)
    assert not rl.allow("a", now=1.0)
    assert rl.allow("b", now=1.0)
    assert not rl.allow("b", now=2.0)


@pytest.mark.parametrize("per_minute", [0, -1])
def test_non_positive_limit_disables(per_minute: int) -> None:
    rl = RateLimiter(per_minute)
    assert all(rl.allow("ip", now=0.0) for _ in range(100))


def test_real_clock() -> None:
    rl = RateLimiter(2)
    assert rl.allow("ip")
    assert rl.allow("ip")
    assert not rl.allow("ip")


def test_tracked_keys_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "MAX_TRACKED_CLIENTS", 5)
    rl = RateLimiter(1)
    for i in range(20):
        assert rl.allow(f"ip{i}", now=0.0)
    assert len(rl._hits) == 5
    # the least recently seen keys were evicted and start afresh
    assert rl.allow("ip0", now=1.0)
    # recently seen keys are still limited
    assert not rl.allow("ip19", now=1.0)


def test_recent_use_protects_a_key_from_eviction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bootstrap, "MAX_TRACKED_CLIENTS", 3)
    rl = RateLimiter(1)
    assert rl.allow("keep", now=0.0)
    assert rl.allow("x1", now=0.0)
    assert rl.allow("x2", now=0.0)
    assert not rl.allow("keep", now=1.0)  # refreshed: now the most recent key
    assert rl.allow("x3", now=1.0)  # evicts x1, not keep
    assert not rl.allow("keep", now=2.0)
    assert rl.allow("x1", now=2.0)


def test_default_bound() -> None:
    assert bootstrap.MAX_TRACKED_CLIENTS == 10_000
