"""Composition root: builds the bridge once per process and tears it down.

Lifecycle: :meth:`Bridge.start` (store, upstream pool, router, executors, reapers),
:meth:`Bridge.drain` (refuse new turns, let running ones finish within the grace
period, then cancel them), :meth:`Bridge.close` (agents, gateway, pool, store).
``serve`` hangs these on the aiohttp app's ``cleanup_ctx`` and ``on_shutdown``
(transport/http.py); ``acp-stdio`` uses ``async with bridge``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import aiohttp

from xwm_bridge.app.health import HealthSampler
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core import principals
from xwm_bridge.core.journal import TurnJournal
from xwm_bridge.core.modes import Mode
from xwm_bridge.core.queues import ThreadQueues
from xwm_bridge.core.sessions import SessionRegistry
from xwm_bridge.core.turns import TurnRunner
from xwm_bridge.core.watch import EventLog
from xwm_bridge.gateway.manager import GatewayManager
from xwm_bridge.gateway.turns import GatewayTurnExecutor
from xwm_bridge.multiagent.executor import MultiAgentExecutor
from xwm_bridge.netaddr import is_loopback_host, parse_listen
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.providers.http1_pool import Http1Pool
from xwm_bridge.providers.single_agent import SingleAgentExecutor
from xwm_bridge.providers.stdio import registry
from xwm_bridge.providers.stdio.catalog import FILE_NAME as CATALOG_FILE
from xwm_bridge.providers.stdio.catalog import AgentCatalog
from xwm_bridge.providers.stdio.executor import ProviderKindExecutor, StdioAgentExecutor
from xwm_bridge.providers.stdio.permissions import (
    POLICY,
    RESOLUTIONS,
    PermissionAnswer,
    PermissionBroker,
)
from xwm_bridge.providers.upstream import UpstreamClient
from xwm_bridge.proxy import ProxySettings, aiohttp_session_options
from xwm_bridge.router.service import Router
from xwm_bridge.store import open_store, state_dir
from xwm_bridge.store.base import SessionStore, StoreUnavailable
from xwm_bridge.store.cluster import Cluster
from xwm_bridge.store.records import Answerer, PermissionRecord
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.tasks import Supervisor

log = logging.getLogger("xwm_bridge.bridge")

#: bearer tokens shorter than this are warned about at start
SHORT_TOKEN = 16
PRUNE_INTERVAL = 300.0
#: the warning when periodic prunes start failing for a store outage (once per outage)
PRUNE_FAILED = "session store prune failed: store unavailable"
#: after a forced exit, how long cancelled turns get to tell their upstreams
FORCED_CANCEL_WAIT = 2.0
#: idle keep-alive connections to upstreams are reused for this long (the pool stays
#: warm); below the usual server-side keep-alive timeouts, so a reused one is alive
UPSTREAM_KEEPALIVE = 30.0


def store_error_counts(store: SessionStore) -> dict[str, int]:
    c = store.counters
    return {
        "bad_record": c.bad_records,
        "write": c.write_errors,
        "restart": c.restarts,
        "prune": c.prune_errors,
    }


class Bridge:
    """Owns the sessions, thread queues, upstream client and background tasks."""

    def __init__(
        self,
        config: BridgeConfig,
        sources: Mapping[str, str] | None = None,
        proxies: ProxySettings | None = None,
    ) -> None:
        #: the forward proxies for every outbound call and dial, read once from the
        #: bridge's own environment (load_config has already refused a bad value)
        self.proxies = ProxySettings.from_env(os.environ) if proxies is None else proxies
        #: local agents found on PATH become providers (providers/stdio/registry.py)
        self.agents = registry.detect(config)
        config = self.config = self.agents.config
        #: where each config value came from (``doctor``, the console's config view)
        self.config_sources: Mapping[str, str] = dict(sources or {})
        self.supervisor = Supervisor()
        store = self.store = open_store(config)
        shared = isinstance(store, RedisStore)
        cc = config.console
        #: the live feed of ``bridge.watch`` (issue 13)
        self.events = EventLog(cc.event_buffer, max_pending=cc.watch_max_pending)
        self.sessions = SessionRegistry(
            store, shared=shared, history_max_bytes=config.store.history_max_bytes
        )
        self.sessions.events = self.events
        self.sessions.close_wait = config.limits.session_close_wait
        # sessions belong to the principal that made them once clients authenticate
        self.sessions.enforce_owner = config.authenticates
        self.sessions.admins = frozenset(principals.digest(t) for t in config.admin_tokens)
        self.sessions.single_principal = not (config.client_tokens or config.admin_tokens)
        #: several replicas on one Redis: cross-replica thread queues and cancel
        self.cluster = (
            Cluster(store, self.sessions.cancel, close_local=self.sessions.closed_elsewhere)
            if isinstance(store, RedisStore)
            else None
        )
        if self.cluster is not None:
            self.sessions.must_reload = self.cluster.must_reload
        self.queues = ThreadQueues(self.supervisor, max_depth=config.limits.max_queue_depth)
        self.metrics = Metrics()
        self.metrics.bind_state(
            active_turns=self.sessions.running_count,
            queue_depth=self.queues.total_waiting,
            threads=lambda: len(self.queues),
            sessions=lambda: len(self.sessions),
        )
        self.permissions = PermissionBroker(owner=self.events.epoch)
        self.permissions.listeners.append(self._permission_changed)
        if self.cluster is not None:  # answers given on other replicas, for requests raised here
            self.cluster.answer_local = self._answer_forwarded
        catalog_path = None if config.store.backend == "memory" else state_dir(config)
        self.stdio_agents = StdioAgentExecutor(
            config,
            self.permissions,
            self.metrics,
            AgentCatalog(catalog_path / CATALOG_FILE if catalog_path else None),
        )
        self.gateway = GatewayManager(config, self.proxies)
        self.metrics.bind_gateway(
            self.gateway.status_counts,
            self.gateway.frames_ignored,
            self.gateway.connects_refused,
            self.gateway.notify_dropped,
        )
        self.metrics.bind_store(store.alive, lambda: store_error_counts(store))
        self.health = HealthSampler(self)
        self._http: aiohttp.ClientSession | None = None
        self._upstream_pool: Http1Pool | None = None
        self._router: Router | None = None
        self._runner: TurnRunner | None = None
        self._drained = False
        self._closed = False
        #: set by :meth:`force_shutdown` (a second signal): the drain stops waiting
        self._forced = asyncio.Event()
        #: the last periodic prune failed for a store outage (logged once, see _prune)
        self._prune_failing = False

    def _answer_forwarded(self, answer: dict[str, Any]) -> dict[str, Any]:
        """A ``session.permission`` another replica took for a request raised here."""
        by = answer.get("by") if isinstance(answer.get("by"), dict) else {}
        assert isinstance(by, dict)
        answerer = Answerer(
            str(by.get("transport", "")), str(by.get("address", "")), str(by.get("principal", ""))
        )
        return self.permissions.answer(
            PermissionAnswer.parse(answer),
            answerer,
            lambda owner: self.sessions.may_use(owner, answerer.principal),
        )

    def _permission_changed(self, type_: str, record: PermissionRecord) -> None:
        """Pending requests live in the store (every replica and a reconnecting client
        see them) and every change goes to the watchers."""
        if record.resolution != POLICY:
            if record.state == "pending":
                self.store.save_permission(record)
            else:
                self.store.delete_permission(record.session_id, record.request_id)
        self.events.publish("permission", type_, record.wire(), record.session_id)
        if type_ == "resolved":  # a bounded label: one of the broker's resolutions
            resolution = record.resolution if record.resolution in RESOLUTIONS else "other"
            self.metrics.permission_resolutions.get(resolution).inc()

    @property
    def http(self) -> aiohttp.ClientSession:
        """The shared outbound HTTP client (connection pool)."""
        if self._http is None:
            raise RuntimeError("Bridge.start() has not been called")
        return self._http

    @property
    def router(self) -> Router:
        if self._router is None:
            raise RuntimeError("Bridge.start() has not been called")
        return self._router

    @property
    def runner(self) -> TurnRunner:
        if self._runner is None:
            raise RuntimeError("Bridge.start() has not been called")
        return self._runner

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def log_agents(self) -> None:
        """The startup line: which local agents were found, which not and why; a
        configured one (a ``kind: stdio`` provider, the adapter's agent) that is not
        found is a warning of its own: every turn on it will fail."""
        for a in self.agents.agents:
            if a.source == "config" and not a.found:
                log.warning(
                    "configured agent not found",
                    extra={
                        "provider": a.id,
                        "reason": a.reason,
                        "hint": "install it, fix its command (or --agent-bin), "
                        "or add its directory to agents.search_paths / PATH",
                    },
                )
        found = {a.id: a.path for a in self.agents.agents if a.found}
        log.info(
            "local agents",
            extra={
                "found": found,
                "not_found": self.agents.missing,
                "sandbox": self.config.agents.sandbox,
            },
        )
        detected = [a.id for a in self.agents.agents if a.found and a.source == "registry"]
        host, _ = parse_listen(self.config.listen)
        if detected and not is_loopback_host(host) and self.config.agents.sandbox == "none":
            log.warning(
                "local agents found on PATH serve remote clients unsandboxed: any "
                "authenticated client can run them in a directory it names; set "
                "agents.sandbox: bwrap or agents.detect: false",
                extra={"agents": detected, "listen": self.config.listen},
            )

    def log_short_tokens(self) -> None:
        """A client token under ``SHORT_TOKEN`` characters: guessable, and, masked like
        every configured secret wherever it appears, it garbles log lines (a token
        ``x`` turns ``xwm_bridge`` into ``[REDACTED]wm_bridge``)."""
        cfg = self.config
        tokens = {
            "auth_token": (cfg.auth_token,),
            "client_tokens": cfg.client_tokens,
            "admin_tokens": cfg.admin_tokens,
        }
        short = [k for k, values in tokens.items() if any(0 < len(v) < SHORT_TOKEN for v in values)]
        if short:
            log.warning(
                "short bearer token",
                extra={
                    "which": short,
                    "hint": f"use at least {SHORT_TOKEN} random characters "
                    "(openssl rand -hex 32): a short token is guessable, and every "
                    "place it occurs in a log line is masked",
                },
            )

    async def start(self) -> None:
        self.log_agents()
        self.log_short_tokens()
        if self.proxies.active:  # credentials masked
            log.info("outbound proxy", extra=self.proxies.summary())
        await self.store.start()
        if self.cluster is not None:
            await self.cluster.start()
        interrupted = await self.store.recover()
        if interrupted:
            log.warning("turns interrupted by the last shutdown", extra={"count": len(interrupted)})
        # the router's classifier, multi-agent LLM calls and bootstrap use aiohttp
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, ttl_dns_cache=60)
        options = aiohttp_session_options(self.proxies)
        self._http = aiohttp.ClientSession(connector=connector, **options)
        router = self._router = Router(self.config, self._http)
        self._upstream_pool = Http1Pool(idle_timeout=UPSTREAM_KEEPALIVE)
        upstream = UpstreamClient(self._upstream_pool, self.proxies)
        single = SingleAgentExecutor(self.config, upstream, self.metrics)
        self._runner = TurnRunner(
            self.sessions,
            self.supervisor,
            {
                Mode.SINGLE_AGENT: ProviderKindExecutor(single, self.stdio_agents),
                Mode.MULTI_AGENT: MultiAgentExecutor(self.config, self._http),
                Mode.GATEWAY_CHAT: GatewayTurnExecutor(self.gateway),
            },
            self.metrics,
            router,
        )
        journal = self._runner.journal = TurnJournal(self.store, self.events)
        book = self.health.book
        journal.observers.append(lambda t: book.observe(t.provider, t.status, t.error))
        spawn = self.supervisor.spawn
        spawn(self.health.run(), name="health-sampler", service=True)
        spawn(self.gateway.run_reaper(), name="gateway-reaper", service=True)
        spawn(self._reap(), name="session-reaper", service=True)

    async def _reap(self) -> None:
        ttl = self.config.limits.session_idle_ttl
        interval = max(0.05, min(ttl / 2, 30.0))
        next_prune = 0.0
        while True:
            await asyncio.sleep(interval)
            reaped = self.sessions.reap(ttl)
            if reaped:
                log.debug("reaped idle sessions", extra={"count": reaped})
            if time.monotonic() >= next_prune:  # the store keeps them until retention
                next_prune = time.monotonic() + PRUNE_INTERVAL
                await self._prune()

    async def _prune(self) -> None:
        """One periodic prune. A store outage (Redis down, the SQLite thread stuck) is
        not a bug: it is counted (``xwm_store_errors_total{kind="prune"}``) and logged
        once as a warning, with no traceback, when prunes start failing, and once at
        info when one goes through again."""
        store = self.store
        try:
            pruned = await store.prune()
        except (StoreUnavailable, TimeoutError) as exc:
            store.counters.prune_errors += 1
            if not self._prune_failing:
                self._prune_failing = True
                reason = str(exc) or "no answer in time"
                log.warning(PRUNE_FAILED, extra={"store": store.name, "error": reason})
            return
        except Exception:  # anything else is a bug: its traceback is wanted
            store.counters.prune_errors += 1
            log.exception("session store prune failed", extra={"store": store.name})
            return
        if self._prune_failing:
            self._prune_failing = False
            log.info("session store prune recovered", extra={"store": store.name})
        if pruned:
            log.debug("pruned stored sessions", extra={"count": pruned})

    @property
    def forced(self) -> bool:
        return self._forced.is_set()

    def force_shutdown(self) -> None:
        """Cut the drain short: running turns are cancelled now (their callers still
        get a cancelled result; upstream cancels get at most ``FORCED_CANCEL_WAIT``)."""
        self._forced.set()

    async def _wait_turns(self, within: float) -> bool:
        """Wait until no turn runs, at most ``within`` seconds or until forced."""
        if self._forced.is_set():
            return len(self.supervisor) == 0
        # both waiters are owned here: awaited together, the loser cancelled below
        forced = asyncio.ensure_future(self._forced.wait())
        idle = asyncio.ensure_future(self.supervisor.wait(within))
        try:
            await asyncio.wait((forced, idle), return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
            idle.cancel()
        return idle.done() and not idle.cancelled() and idle.result()

    async def drain(self, grace: float | None = None) -> None:
        """Refuse new and waiting turns, let running turns finish within ``grace``
        seconds (or until :meth:`force_shutdown`), then cancel them (their callers
        get a cancelled result and the upstream a ``session.cancel``)."""
        if self._drained:
            return
        self._drained = True
        grace = self.config.limits.shutdown_grace if grace is None else grace
        self.supervisor.begin_shutdown()
        refused = self.queues.close()
        running = self.sessions.running_count()
        log.info("draining", extra={"running_turns": running, "refused_waiting": refused})
        if not await self._wait_turns(grace):
            cancelled = self.sessions.cancel_all()
            why = "forced exit" if self.forced else "grace period over"
            log.warning(f"{why}; cancelling turns", extra={"cancelled": cancelled})
            cancel_wait = self.config.limits.upstream_cancel_timeout + 2
            if self.forced:
                cancel_wait = min(cancel_wait, FORCED_CANCEL_WAIT)
            await self.supervisor.wait(cancel_wait)
        await self.supervisor.shutdown(0)

    async def close(self, grace: float | None = None) -> None:
        """Drain (if not done yet), then release every resource: agent process groups
        are terminated, every queued session write reaches the store. Idempotent."""
        await self.drain(grace)
        if self._closed:
            return
        self._closed = True
        await self.stdio_agents.close()
        await self.gateway.close()
        if self._upstream_pool is not None:
            await self._upstream_pool.close()
        if self._router is not None:  # its classifier calls use the HTTP client
            await self._router.close()
        if self._http is not None:
            await self._http.close()
        if self.cluster is not None:
            await self.cluster.close()
        await self.store.close()
