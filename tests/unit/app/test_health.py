"""The health sampler: its pure parts, and the snapshot of a bridge that is not started."""

from __future__ import annotations

from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.health import ProviderBook, changes, snapshot
from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.observability.logging import Redactor


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


def test_figures_sum_every_label_set_and_count_failed_requests() -> None:
    from xwm_bridge.app.bridge import Bridge
    from xwm_bridge.app.health import figures
    from xwm_bridge.config import load_config

    cfg = load_config(env={"ACP_AUTH_TOKEN": "t" * 32, "XWM_SESSION_STORE": "memory"}).config
    bridge = Bridge(cfg)
    m = bridge.metrics
    m.requests.labels("session.message", "http", "ok").inc(5)
    m.requests.labels("session.message", "sse", "error").inc(2)
    m.requests.labels("acp.capabilities", "ws", "rejected").inc(1)
    m.bytes_in.labels("http").inc(100)
    m.bytes_in.labels("ws").inc(20)
    m.bytes_out.labels("sse").inc(7)
    m.turn_seconds.labels("singleAgent", "single-agent", "codex", "ok").observe(0.5)
    m.turn_seconds.labels("singleAgent", "single-agent", "codex", "error").observe(1.5)
    m.upstream_errors.labels("codex", "timeout").inc(3)
    m.ws_connections.inc(2)
    f = figures(bridge)
    assert (f["requests"], f["requestErrors"]) == (8, 3)
    assert (f["bytesIn"], f["bytesOut"]) == (120, 7)
    assert (f["turns"], f["turnSeconds"]) == (2, 2.0)
    assert (f["upstreamErrors"], f["wsConnections"]) == (3, 2)


def test_a_provider_s_last_error_is_masked_like_the_agents() -> None:
    """bridge.health masked agents' and gateways' lastError with every secret of the
    config; a provider's kept the raw text (only the wire's narrower set applied)."""
    secret = "internal-token-0123456789"
    cfg = BridgeConfig(
        internal_service_token=secret,
        providers=(ProviderConfig("codex", endpoint="http://127.0.0.1:9"),),
    )
    book = ProviderBook()
    book.observe("codex", "failed", f"upstream said: bad token {secret}")
    health = snapshot(Bridge(cfg), book, Redactor(cfg.secrets()))
    (row,) = [r for r in health["providers"] if r["id"] == "codex"]
    assert secret not in row["lastError"] and "[REDACTED]" in row["lastError"]
