"""Prometheus metrics for ``/metrics`` (prometheus-client, one registry per process)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from xwm_bridge.observability.logging import dropped_lines

__all__ = ["CONTENT_TYPE", "Metrics"]


class Children:
    """A labelled metric's children, bound once per label set (``labels()`` validates
    and locks on every call; a dict lookup does not). Label values must be bounded."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: Counter | Histogram) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def get(self, *labels: str) -> Any:
        child = self._children.get(labels)
        if child is None:
            child = self._children[labels] = self._metric.labels(*labels)
        return child


class _LogLines(Collector):
    """``xwm_log_lines_dropped_total``: read from the log sink on each scrape."""

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "xwm_log_lines_dropped",
            "Log lines not written: stderr refused them, or took nothing until the queue was full",
            value=dropped_lines(),
        )


#: ``outcome`` of ``xwm_turn_duration_seconds``
TURN_OUTCOMES = ("success", "failed", "cancelled", "interrupted")

TURN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """Counters and histograms updated by the core; gauges read live state on scrape."""

    def __init__(self) -> None:
        # no ``*_created`` series: they double the scrape size and nothing reads them
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, _resident_memory_bytes, …
        r.register(_LogLines())
        self.requests = Counter(
            "xwm_requests",
            "JSON-RPC requests by method, transport and outcome (ok, error, internal_error, "
            "store_unavailable, abandoned; turns: failed, cancelled)",
            ["method", "transport", "outcome"],
            registry=r,
        )
        self.turn_seconds = Histogram(
            "xwm_turn_duration_seconds",
            "Turn latency from the head of the thread queue to the result, by execution "
            "target, mode, provider and outcome (success, failed, cancelled, interrupted)",
            ["target", "mode", "provider", "outcome"],
            buckets=TURN_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "xwm_rejected_requests",
            "Requests refused before reaching a method, by transport and reason",
            ["transport", "reason"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "xwm_upstream_errors",
            "Failed upstream calls by provider and kind",
            ["provider", "kind"],
            registry=r,
        )
        self.agent_tokens = Counter(
            "xwm_agent_tokens",
            "Tokens local agents reported, by provider, model and kind "
            "(input, output, thought, cached_read, cached_write)",
            ["provider", "model", "kind"],
            registry=r,
        )
        self.agent_cost = Counter(
            "xwm_agent_cost",
            "Cost local agents reported, by provider, model and currency",
            ["provider", "model", "currency"],
            registry=r,
        )
        self.permissions = Counter(
            "xwm_permission_requests",
            "Stdio-agent permission requests by how they were resolved (policy, selected, "
            "expired, cancelled, agent_exited, turn_ended)",
            ["resolution"],
            registry=r,
        )
        self.bytes_in = Counter(
            "xwm_bytes_received", "Request bytes received by transport", ["transport"], registry=r
        )
        self.bytes_out = Counter(
            "xwm_bytes_sent", "Response and notification bytes sent", ["transport"], registry=r
        )
        self.bootstrap_failures = Counter(
            "xwm_bootstrap_failures",
            "Bootstrap consumes that failed on the bridge's side, by reason (transport, "
            "timeout, http_status, protocol, not_configured)",
            ["reason"],
            registry=r,
        )
        self._connections_closed = Counter(
            "xwm_connections_closed",
            "Client connections closed by a limit (per_address, header_timeout, send_timeout)",
            ["reason"],
            registry=r,
        )
        self.ws_connections = Gauge(
            "xwm_websocket_connections", "Open client WebSocket connections", registry=r
        )
        self._active_turns = Gauge("xwm_active_turns", "Turns executing now", registry=r)
        self._queue_depth = Gauge(
            "xwm_queue_depth", "Turns waiting behind a running turn, all threads", registry=r
        )
        self._threads = Gauge(
            "xwm_threads_alive", "Threads with a running or waiting turn", registry=r
        )
        self._sessions = Gauge("xwm_sessions_alive", "Session records held in memory", registry=r)
        #: bound children of the per-request and per-turn series
        self.request_outcomes = Children(self.requests)
        self.turn_durations = Children(self.turn_seconds)
        self.upstream_failures = Children(self.upstream_errors)
        self.rejections = Children(self.rejected)
        self.agent_token_counts = Children(self.agent_tokens)
        self.agent_costs = Children(self.agent_cost)
        self.permission_resolutions = Children(self.permissions)
        self.received = Children(self.bytes_in)
        self.sent = Children(self.bytes_out)
        self.connections_closed = Children(self._connections_closed)
        self.bootstrap_failed = Children(self.bootstrap_failures)

    def bind_gateway(
        self,
        status_counts: Callable[[], dict[str, int]],
        frames_ignored: Callable[[], dict[str, int]] | None = None,
        connects_refused: Callable[[], dict[str, int]] | None = None,
        notify_dropped: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        """``xwm_gateway_runtimes{state}``, ``xwm_gateway_frames_ignored_total{reason}``,
        ``xwm_gateway_connects_refused_total{reason}`` (``TOO_MANY``: the
        per-principal or the bridge-wide runtime limit) and
        ``xwm_gateway_notify_dropped_total{reason}`` (a client dropped from a runtime's
        notifications: ``overflow``, ``timeout``), read from the gateway manager on each
        scrape."""
        registry = self.registry

        class _GatewayStates(Collector):
            def collect(self) -> Iterable[Metric]:
                family = GaugeMetricFamily(
                    "xwm_gateway_runtimes", "Gateway runtimes by state", labels=["state"]
                )
                counts = status_counts()
                for state in sorted({"connected", "connecting", "error", *counts}):
                    family.add_metric([state], counts.get(state, 0))
                yield family
                if frames_ignored is not None:
                    ignored = CounterMetricFamily(
                        "xwm_gateway_frames_ignored",
                        "Frames read from gateways and dropped, by reason",
                        labels=["reason"],
                    )
                    for reason, value in sorted(frames_ignored().items()):
                        ignored.add_metric([reason], value)
                    yield ignored
                if connects_refused is not None:
                    refused = CounterMetricFamily(
                        "xwm_gateway_connects_refused",
                        "Gateway connects refused for want of room (TOO_MANY), by limit",
                        labels=["reason"],
                    )
                    for reason, value in sorted(connects_refused().items()):
                        refused.add_metric([reason], value)
                    yield refused
                if notify_dropped is not None:
                    dropped = CounterMetricFamily(
                        "xwm_gateway_notify_dropped",
                        "Clients dropped from a gateway runtime's notifications, by reason",
                        labels=["reason"],
                    )
                    for reason, value in sorted(notify_dropped().items()):
                        dropped.add_metric([reason], value)
                    yield dropped

        registry.register(_GatewayStates())

    def bind_store(self, up: Callable[[], bool], counts: Callable[[], dict[str, int]]) -> None:
        """``xwm_store_up`` (the writer runs and its last batch was accepted) and
        ``xwm_store_errors_total{kind}`` (``bad_record``: dropped, could not be
        encoded; ``write``: refused by the backend or failed by a bug; ``restart``:
        writer restarted; ``prune``: a periodic prune failed)."""

        class _Store(Collector):
            def collect(self) -> Iterable[Metric]:
                yield GaugeMetricFamily(
                    "xwm_store_up", "Session store writer running and accepting writes", float(up())
                )
                family = CounterMetricFamily(
                    "xwm_store_errors", "Session store failures by kind", labels=["kind"]
                )
                for kind, value in sorted(counts().items()):
                    family.add_metric([kind], value)
                yield family

        self.registry.register(_Store())

    def bind_state(
        self,
        *,
        active_turns: Callable[[], float],
        queue_depth: Callable[[], float],
        threads: Callable[[], float],
        sessions: Callable[[], float],
    ) -> None:
        self._active_turns.set_function(active_turns)
        self._queue_depth.set_function(queue_depth)
        self._threads.set_function(threads)
        self._sessions.set_function(sessions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
