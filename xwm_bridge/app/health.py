"""Health and metrics samples for the operator views (issue 13).

Every ``console.health_interval`` seconds the sampler reads the live state —
providers (from turn outcomes), stdio agents, gateway runtimes, thread queues and
the figures ``/metrics`` shows — and publishes on the event log: a ``metrics``
sample every time (its own bounded ring: the charts' history), and ``health`` /
``queue`` events only when something changed (:func:`changes`, pure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xwm_bridge.observability.logging import Redactor, capped
from xwm_bridge.store.base import CANCELLED, COMPLETED

if TYPE_CHECKING:
    from xwm_bridge.app.bridge import Bridge

log = logging.getLogger("xwm_bridge.health")
#: threads listed in a queue event (the busiest)
MAX_QUEUE_ROWS = 50
MAX_PROVIDERS = 256


@dataclass(slots=True)
class ProviderStats:
    """Turn outcomes of one provider since the process started."""

    turns: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    last_status: str = ""
    last_error: str = ""
    last_ok_at: float = 0.0
    last_error_at: float = 0.0

    def observe(self, status: str, error: str, now: float) -> None:
        self.turns += 1
        self.last_status = status
        if status in (COMPLETED, CANCELLED):
            self.consecutive_failures = 0
            if status == COMPLETED:
                self.last_ok_at = now
            return
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error, self.last_error_at = capped(error, 500), now


@dataclass(slots=True)
class ProviderBook:
    stats: dict[str, ProviderStats] = field(default_factory=dict)
    #: the provider ids worth a row (the configured ones); None: any. A turn routed to
    #: no provider carries the client's own ``provider`` string, which must not take
    #: one of the MAX_PROVIDERS places
    known: frozenset[str] | None = None

    def observe(self, provider: str, status: str, error: str) -> None:
        if not provider or (self.known is not None and provider not in self.known):
            return
        entry = self.stats.get(provider)
        if entry is None:
            if len(self.stats) >= MAX_PROVIDERS:
                return
            entry = self.stats[provider] = ProviderStats()
        entry.observe(status, error, time.time())


def provider_rows(bridge: Bridge, book: ProviderBook) -> list[dict[str, Any]]:
    rows = []
    for p in bridge.config.available_providers:
        s = book.stats.get(p.id, ProviderStats())
        state = "unknown" if s.turns == 0 else "failing" if s.consecutive_failures else "ok"
        rows.append(
            {
                "id": p.id,
                "label": p.label or p.id,
                "kind": p.kind,
                "state": state,
                "turns": s.turns,
                "failures": s.failures,
                "consecutiveFailures": s.consecutive_failures,
                "lastStatus": s.last_status or None,
                "lastError": s.last_error or None,
                "lastOkAt": s.last_ok_at or None,
                "lastErrorAt": s.last_error_at or None,
            }
        )
    return rows


#: the samples the charts sum; read from these metrics only (not the process
#: collector, whose /proc reads cost more than the rest under load)
_SUMMED = (
    "xwm_websocket_connections",
    "xwm_requests_total",
    "xwm_turn_duration_seconds_count",
    "xwm_turn_duration_seconds_sum",
    "xwm_upstream_errors_total",
    "xwm_bytes_received_total",
    "xwm_bytes_sent_total",
)


def _sums(bridge: Bridge) -> tuple[dict[str, float], float]:
    """Each of :data:`_SUMMED` over all its label sets, and the requests whose
    outcome was not ``ok``: one pass over those metrics."""
    totals = dict.fromkeys(_SUMMED, 0.0)
    failed = 0.0
    for family in bridge.metrics.registry.restricted_registry(_SUMMED).collect():
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
                if sample.name == "xwm_requests_total" and sample.labels.get("outcome") != "ok":
                    failed += sample.value
    return totals, failed


def figures(bridge: Bridge) -> dict[str, float]:
    """The ``/metrics`` figures the charts plot (counters are totals: the page
    derives rates from consecutive samples)."""
    sums, failed = _sums(bridge)
    return {
        "activeTurns": bridge.sessions.running_count(),
        "queueDepth": bridge.queues.total_waiting(),
        "threads": len(bridge.queues),
        "sessions": len(bridge.sessions),
        "wsConnections": sums["xwm_websocket_connections"],
        "requests": sums["xwm_requests_total"],
        "requestErrors": failed,
        "turns": sums["xwm_turn_duration_seconds_count"],
        "turnSeconds": sums["xwm_turn_duration_seconds_sum"],
        "upstreamErrors": sums["xwm_upstream_errors_total"],
        "bytesIn": sums["xwm_bytes_received_total"],
        "bytesOut": sums["xwm_bytes_sent_total"],
        "pendingPermissions": len(bridge.permissions.pending),
        "watchers": bridge.events.subscribers,
    }


def queue_rows(bridge: Bridge) -> list[dict[str, Any]]:
    depths = sorted(
        ((bridge.queues.depth(tid), tid) for tid in bridge.queues.threads()),
        key=lambda d: (-d[0], d[1]),
    )
    return [{"threadId": tid, "waiting": n} for n, tid in depths[:MAX_QUEUE_ROWS]]


def _masked(rows: list[dict[str, Any]], redactor: Redactor) -> list[dict[str, Any]]:
    """Rows with every secret of the config masked in their ``lastError``."""
    for row in rows:
        if row.get("lastError"):
            row["lastError"] = redactor.text(str(row["lastError"]))
    return rows


def snapshot(bridge: Bridge, book: ProviderBook, redactor: Redactor) -> dict[str, Any]:
    """``bridge.health``: everything the health view shows, secrets redacted."""
    return {
        "providers": _masked(provider_rows(bridge, book), redactor),
        "agents": _masked(bridge.stdio_agents.status(), redactor),
        "gateways": _masked(bridge.gateway.status(), redactor),
        "queues": {
            "waiting": bridge.queues.total_waiting(),
            "running": bridge.sessions.running_count(),
            "threads": queue_rows(bridge),
        },
        "metrics": figures(bridge),
        "ts": time.time(),
    }


def changes(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """Which parts of a health snapshot changed (``metrics`` and ``ts`` never count)."""
    parts = ("providers", "agents", "gateways", "queues")
    if before is None:
        return list(parts)
    return [p for p in parts if before.get(p) != after.get(p)]


class HealthSampler:
    def __init__(self, bridge: Bridge) -> None:
        self._bridge = bridge
        self.book = ProviderBook(known=frozenset(p.id for p in bridge.config.available_providers))
        self._redactor = Redactor(bridge.config.secrets())
        self._last: dict[str, Any] | None = None

    def snapshot(self) -> dict[str, Any]:
        return snapshot(self._bridge, self.book, self._redactor)

    def sample(self) -> None:
        events = self._bridge.events
        now = self.snapshot()
        events.publish("metrics", "sample", {"metrics": now["metrics"]})
        changed = changes(self._last, now)
        self._last = now
        if "queues" in changed:
            events.publish("queue", "depth", now["queues"])
        health = [p for p in changed if p != "queues"]
        if health:
            events.publish("health", "changed", {p: now[p] for p in health})

    async def run(self) -> None:
        interval = self._bridge.config.console.health_interval
        while True:
            try:
                self.sample()
            except Exception:
                log.exception("health sample failed")
            await asyncio.sleep(interval)
