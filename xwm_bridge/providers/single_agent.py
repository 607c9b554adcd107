"""Single-agent turns: forward to an upstream ACP provider (forwarding.md §4)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.core.context import TurnContext
from xwm_bridge.core.executors import CANCELLED
from xwm_bridge.core.handles import cancel_arrived
from xwm_bridge.core.modes import Mode
from xwm_bridge.endpoint import Endpoint, EndpointError, derive_endpoint
from xwm_bridge.observability.metrics import Metrics
from xwm_bridge.providers import artifacts
from xwm_bridge.providers.collector import Collector, remote_fields, result_object
from xwm_bridge.providers.upstream import UpstreamClient, UpstreamError

log = logging.getLogger("xwm_bridge.single_agent")

MODE = Mode.SINGLE_AGENT.value
NOT_ADVERTISED = "provider is not advertised by the bridge"


def provider_id_of(ctx: TurnContext) -> str:
    """§4.1: the session's provider, else the turn's ``provider`` param, else codex."""
    return (ctx.session.provider or ctx.turn.provider or "codex").lower()


def failure_result(ctx: TurnContext, message: str) -> dict[str, Any]:
    """§4.10: the failure result of a single-agent turn (HTTP/WS upstream or stdio agent)."""
    return {
        "success": False,
        "error": message,
        "turnId": ctx.turn_id,
        "mode": MODE,
        "provider": provider_id_of(ctx),
    }


class SingleAgentExecutor:
    def __init__(
        self, config: BridgeConfig, upstream: UpstreamClient, metrics: Metrics | None = None
    ) -> None:
        self._config = config
        self._upstream = upstream
        self._metrics = metrics or Metrics()
        self._limits = artifacts.ArtifactLimits.of_config(config)
        self._providers = {p.id.lower(): p for p in config.available_providers}
        #: per provider, derived once (the config is frozen): its endpoint (or why it has
        #: none) and its outbound Authorization
        self._targets: dict[str, tuple[Endpoint | str, str]] = {}
        for key, p in self._providers.items():
            try:
                target: Endpoint | str = derive_endpoint(p.endpoint)
            except EndpointError as exc:
                target = str(exc)
            self._targets[key] = (target, config.provider_authorization(p))

    def _provider_id(self, ctx: TurnContext) -> str:
        return provider_id_of(ctx)

    def failure(self, ctx: TurnContext, message: str) -> dict[str, Any]:
        return failure_result(ctx, message)

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        provider_id = self._provider_id(ctx)
        provider = self._providers.get(provider_id)
        if provider is None:
            await ctx.emit_error(NOT_ADVERTISED)
            return self.failure(ctx, NOT_ADVERTISED)
        collector = Collector()

        async def on_notifications(frames: list[dict[str, Any]]) -> None:
            for frame in frames:
                collector.observe(frame)
            await ctx.relay_many(frames)

        endpoint, authorization = self._targets[provider_id]
        if isinstance(endpoint, str):  # the provider's URL is unusable
            await ctx.emit_error(endpoint)
            return self.failure(ctx, endpoint)

        async def cancel_upstream() -> None:
            # owned by the supervisor so it survives this task's cancellation; bounded
            cancel = ctx.supervisor.spawn(
                self._upstream.send_cancel(
                    provider,
                    endpoint,
                    authorization,
                    {"sessionId": ctx.session_id, "threadId": ctx.session.thread_id},
                    self._config.limits.upstream_cancel_timeout,
                ),
                name=f"upstream-cancel:{ctx.session_id}",
            )
            await asyncio.shield(cancel)

        try:
            response = await self._upstream.call(
                provider,
                endpoint,
                authorization,
                ctx.turn.method,
                ctx.params,  # already stripped of the §4.2 keys (core/turn.py)
                on_notifications,
                # ask for SSE only when someone can receive the notifications
                stream=provider.stream and (ctx.notify is not None or ctx.watched),
            )
        except UpstreamError as exc:
            message = str(exc)
            fields = {"session_id": ctx.session_id[:128], "provider": provider.id}
            fields.update(kind=exc.kind, error=message)  # kind: the metric's label
            log.warning("upstream call failed", extra=fields)
            self._metrics.upstream_failures.get(provider.id, exc.kind).inc()
            if exc.timed_out:  # the upstream may still be working on it
                await cancel_upstream()
            await ctx.emit_error(message)
            return self.failure(ctx, message)
        except asyncio.CancelledError:
            cancel_arrived()  # not sent again into the upstream cancel
            self._metrics.upstream_failures.get(provider.id, "cancelled").inc()
            await cancel_upstream()
            raise

        result = result_object(response)
        collector.apply(result)
        inner = result.get("result")
        if isinstance(inner, dict) and inner:
            result = dict(inner)
        result.setdefault("provider", provider.id)
        result.setdefault("mode", MODE)
        result.setdefault("turnId", ctx.turn_id)
        wd = ctx.turn.working_directory
        if wd:
            result.setdefault("effectiveWorkingDirectory", wd)
        remote_fields(result, wd)
        upstream_artifacts = result.get("artifacts")
        if not (isinstance(upstream_artifacts, list) and upstream_artifacts):
            roots = [
                wd,
                coerce.text(result.get("resolvedWorkingDirectory")),
                coerce.text(result.get("effectiveWorkingDirectory")),
            ]
            # no thread hop when nothing may be read (the common server deployment)
            result["artifacts"] = (
                await asyncio.to_thread(artifacts.collect, roots, self._limits)
                if self._limits.allowed_roots
                else []
            )
        return result

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit_error(CANCELLED)
        return {**self.failure(ctx, CANCELLED), "cancelled": True}
