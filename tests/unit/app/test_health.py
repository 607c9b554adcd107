"""Pure parts of the health sampler."""

from __future__ import annotations

from xwm_bridge.app.health import ProviderBook, changes


def test_changes_ignore_figures_and_time() -> None:
    a = {
        "providers": [1],
        "agents": [],
        "gateways": [],
        "queues": {"waiting": 0},
        "metrics": {"x": 1},
        "ts": 1,
    }
    b = {**a, "metrics": {"x": 2}, "ts": 2}
    assert changes(None, a) == ["providers", "agents", "gateways", "queues"]
    assert changes(a, b) == []
    assert changes(a, {**b, "queues": {"waiting": 3}}) == ["queues"]


def test_provider_book_counts_consecutive_failures() -> None:
    book = ProviderBook()
    book.observe("codex", "failed", "boom")
    book.observe("codex", "failed", "boom again")
    s = book.stats["codex"]
    assert s.failures == 2 and s.consecutive_failures == 2 and s.last_error == "boom again"
    book.observe("codex", "completed", "")
    assert s.consecutive_failures == 0 and s.last_ok_at > 0 and s.turns == 3
    book.observe("", "failed", "x")  # no provider: not counted
    assert list(book.stats) == ["codex"]
