"""Wires the resolver to its real I/O: memory files, the LLM classifier and the
skill commands. One :class:`Router` per bridge, shared by
``xworkmate.routing.resolve`` and the turn pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.netaddr import HostPolicy, endpoint_of
from xwm_bridge.router import memory, memory_write
from xwm_bridge.router.classifier import Classifier, Endpoint, choose_endpoint
from xwm_bridge.router.resolver import (
    MULTI_AGENT,
    SINGLE_AGENT,
    RoutingDecision,
    RoutingRequest,
    resolve,
)
from xwm_bridge.router.skills import SkillCommands

log = logging.getLogger("xwm_bridge.router")
LOCATIONS_CACHED = 1024


class Router:
    def __init__(self, config: BridgeConfig, http: aiohttp.ClientSession | None) -> None:
        rc = config.router
        self._config = config
        self._available = [p.id for p in config.available_providers]
        self.classifier = Classifier(
            http,
            model=config.routing_model,
            timeout=rc.classifier_timeout,
            cache_ttl=rc.classifier_cache_ttl,
            cache_entries=rc.classifier_cache_entries,
            max_concurrency=rc.classifier_max_concurrency,
        )
        self.memory = memory.MemoryReader(rc.memory_max_bytes)
        #: where a client's own classifier URL may point (issue 16 item 10)
        self.classifier_hosts = HostPolicy(
            rc.classifier_allowed_hosts, config.configured_endpoints()
        )
        self._located: dict[str, tuple[float, memory.MemoryLocations]] = {}
        self.skills = SkillCommands(
            enabled=rc.skill_commands_enabled,
            find_bin=rc.find_skills_bin,
            install_bin=rc.install_skill_bin,
            timeout=rc.skill_command_timeout,
            max_output=rc.skill_command_max_output,
        )
        self._finder = self.skills.find if self.skills.finds else None

    def _locations(self, req: RoutingRequest) -> memory.MemoryLocations | None:
        """Where memory lives for this working directory; resolved (``realpath``) at most
        once per ``memory.STAT_TTL`` per directory, so a turn makes no filesystem call.
        ``None``: the directory must be resolved first (:meth:`_resolved`), off the loop.

        Sync, and inline in the callers: the turn path pays no coroutine for a hit."""
        wd = req.working_directory
        now = time.monotonic()
        hit = self._located.get(wd)
        if hit is not None and now - hit[0] < memory.STAT_TTL:
            return hit[1]
        if len(wd) > memory.MAX_PATH:
            wd = ""  # names no memory (locate); not kept as a key: it is the client's text
            hit = self._located.get(wd)
            if hit is not None and now - hit[0] < memory.STAT_TTL:
                return hit[1]
        cfg = self._config
        if memory.resolves(wd, cfg.memory_roots):
            return None
        return self._keep(wd, now, memory.locate(wd, cfg.router.memory_home, cfg.memory_roots))

    async def _resolved(self, req: RoutingRequest) -> memory.MemoryLocations:
        """:meth:`_locations` of a directory to resolve: the ``realpath`` of a client's
        directory runs in a worker thread; it ``lstat``s every component of a path the
        client chose (outside the roots too: it is how they are checked), and one on a
        hung NFS or automount path held the event loop, so every session, until the
        mount answered."""
        wd, cfg = req.working_directory, self._config
        now = time.monotonic()
        located = await asyncio.to_thread(
            memory.locate, wd, cfg.router.memory_home, cfg.memory_roots
        )
        return self._keep(wd, now, located)

    def _keep(self, wd: str, now: float, located: memory.MemoryLocations) -> memory.MemoryLocations:
        if len(self._located) >= LOCATIONS_CACHED:
            self._located.clear()
        self._located[wd] = (now, located)
        return located

    def _classifier_endpoint(self, req: RoutingRequest) -> Endpoint | None:
        """The classifier to ask: a client's own URL only on an allowed host (issue 16)."""
        rc = self._config.router
        endpoint = choose_endpoint(
            req.gateway_base_url, req.gateway_api_key, rc.llm_base_url, rc.llm_api_key
        )
        if endpoint is not None and req.gateway_api_key.strip():
            host, _, port = endpoint_of(endpoint.base_url).rpartition(":")
            if not host or not self.classifier_hosts.allows(host, int(port or 0)):
                log.info(
                    "classifier skipped: aiGatewayBaseUrl host not allowed",
                    extra={"host": host[:256]},
                )
                return None  # no classifier call: routing falls back as without a key
        return endpoint

    async def resolve(self, req: RoutingRequest) -> RoutingDecision:
        rc = self._config.router
        prefs = memory.NO_PREFERENCES
        if rc.memory_enabled:
            located = self._locations(req) or await self._resolved(req)
            prefs = await self.memory.load(located)

        async def classify(prompt: str) -> str:  # only auto routing gets here
            return await self.classifier.classify(prompt, self._classifier_endpoint(req))

        return await resolve(
            req,
            self._available,
            memory=prefs,
            classify=classify,
            finder=self._finder,
            installer=self.skills.install,
        )

    async def close(self) -> None:
        """End the classifier calls in flight (at shutdown, before the HTTP client)."""
        await self.classifier.close()

    async def record(
        self, req: RoutingRequest, decision: RoutingDecision, result: dict[str, Any]
    ) -> bool:
        """§6.5 memory recording after a turn; failures are logged, never raised."""
        rc = self._config.router
        if (
            not rc.memory_enabled
            or decision.execution_target not in (SINGLE_AGENT, MULTI_AGENT)
            or not req.auto
            or not coerce.loose_bool(result.get("success"))
            or not req.working_directory
        ):
            return False
        located = self._locations(req) or await self._resolved(req)
        target = memory_write.record_target(located)
        if target is None:
            log.info("memory not recorded: working directory outside the memory roots")
            return False
        block = memory_write.render_block(
            decision.execution_target, decision.model, decision.skills, decision.provider_id
        )
        home = memory_write.home_target(located)
        try:
            try:
                await self._append(located, target, block)
            except memory_write.FolderError as exc:
                if home is None or target == home:
                    raise
                # §6.5: <wd>/.xworkmate could not be made: the project-home file
                log.info(
                    "memory written to the home project file",
                    extra={"path": str(home), "reason": str(exc)},
                )
                target = home
                await self._append(located, target, block)
        except OSError as exc:
            log.warning("memory write failed", extra={"path": str(target), "error": str(exc)})
            return False
        return True

    async def _append(self, located: memory.MemoryLocations, target: Path, block: str) -> None:
        # project-home files are named by the client's working directory: bounded in number
        home = target == memory_write.home_target(located)
        try:
            await asyncio.to_thread(
                memory_write.append,
                target,
                block,
                self._config.router.memory_max_bytes,
                located.anchor(target),
                memory_write.MAX_PROJECT_FILES if home else 0,
            )
        finally:
            self.memory.invalidate(str(target))  # the next turn reads what we wrote
