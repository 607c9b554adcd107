"""The stdio agents' processes: one per provider, or one per provider and working
directory under ``agents.sandbox: bwrap``, at most ``agents.max_sandboxed_processes``
then, never closing one another call holds.

A call holds a process from :meth:`AgentProcesses.acquire` to
:meth:`AgentProcesses.release` (:meth:`AgentProcesses.using` around one use); the
executor (:mod:`.executor`) runs turns on them, the agent-adapter its raw calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError
from xwm_bridge.providers.stdio.launch import agent_spec
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.agents")


class AgentBusy(AgentError):
    """Every sandboxed process is held by a call and none may be added (the cap)."""


class AgentProcesses:
    """The processes of the ``kind: stdio`` providers, by (provider id, directory)."""

    def __init__(self, config: BridgeConfig, providers: Mapping[str, ProviderConfig]) -> None:
        self.config = config
        #: lower-cased provider id → its config
        self._providers = providers
        self._agents: OrderedDict[tuple[str, str], AcpAgent] = OrderedDict()
        #: provider id → the ACP protocolVersion its processes' initialize sends, when not
        #: the default (agent-adapter's GEMINI_ADAPTER_PROTOCOL_VERSION)
        self._protocol_versions: dict[str, int] = {}
        #: set (and replaced) when a process is released by its last holder
        self._released = asyncio.Event()
        #: provider id → calls waiting for a place under the sandbox's process cap
        self._waiting: Counter[str] = Counter()

    @property
    def sandboxed(self) -> bool:
        return self.config.agents.sandbox == "bwrap"

    async def acquire(self, provider_id: str, cwd: str = "") -> AcpAgent:
        """The provider's agent process (per working directory when sandboxed), held by
        the caller until :meth:`release` (use :meth:`using`).

        Under the sandbox a new process past ``agents.max_sandboxed_processes`` first
        closes the least recently used one that no call holds, never one with a call in
        flight; when every one is held it waits for a release, at most
        ``agents.process_wait`` seconds, then raises :class:`AgentBusy`.
        """
        pid = provider_id.lower()
        key = (pid, cwd if self.sandboxed else "")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.agents.process_wait
        while key not in self._agents and not self._has_room():
            idle = next((k for k, a in self._agents.items() if not a.users), None)
            if idle is not None:
                await self._agents.pop(idle).close()
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._busy(pid)
            self._waiting[pid] += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._released.wait(), remaining)
            finally:
                self._waiting[pid] -= 1
        agent = self._agents.get(key)
        if agent is None:
            spec = agent_spec(self._providers[pid], self.config, key[1])
            if pid in self._protocol_versions:
                spec = replace(spec, protocol_version=self._protocol_versions[pid])
            agent = self._agents[key] = AcpAgent(spec)
        agent.users += 1
        self._agents.move_to_end(key)
        return agent

    def release(self, agent: AcpAgent) -> None:
        """The caller is done with ``agent``; once no call holds it, the cap may close it."""
        agent.users -= 1
        if agent.users <= 0:
            agent.users = 0
            self._released.set()
            self._released = asyncio.Event()

    @contextlib.asynccontextmanager
    async def using(self, provider_id: str, cwd: str = "") -> AsyncIterator[AcpAgent]:
        """:meth:`acquire` … :meth:`release` around one use of the process."""
        agent = await self.acquire(provider_id, cwd)
        try:
            yield agent
        finally:
            self.release(agent)

    def _has_room(self) -> bool:
        return not self.sandboxed or len(self._agents) < self.config.agents.max_sandboxed_processes

    def _busy(self, provider_id: str) -> AgentBusy:
        limit, wait = self.config.agents.max_sandboxed_processes, self.config.agents.process_wait
        log.warning(
            "no free sandboxed agent process",
            extra={"agent": provider_id, "processes": len(self._agents), "waited": wait},
        )
        busy = f"are busy (agents.max_sandboxed_processes: {limit})"
        if wait > 0:
            busy = f"stayed busy for {wait:g}s (agents.max_sandboxed_processes: {limit})"
        return AgentBusy(
            f"all {limit} sandboxed agent processes {busy}; try again when one is idle"
        )

    def set_protocol_version(self, provider_id: str, version: int) -> None:
        """The ``protocolVersion`` every process of the provider initializes with, those
        running (from their next start) and those started later (one per directory
        when sandboxed)."""
        pid = provider_id.lower()
        self._protocol_versions[pid] = version
        for (p, _), agent in self._agents.items():
            if p == pid:
                agent.spec = replace(agent.spec, protocol_version=version)

    def status(self) -> list[dict[str, Any]]:
        """Every configured stdio agent: started or not, restarts, last error."""
        out = []
        for pid, provider in self._providers.items():
            # one process per provider, or per working directory when sandboxed
            procs = [a.status() for (p, _), a in self._agents.items() if p == pid]
            row: dict[str, Any] = {"id": provider.id, "label": provider.label or provider.id}
            if not procs:
                row.update({"running": False, "starts": 0, "restarts": 0, "lastError": None})
            else:
                row.update(procs[-1])  # the most recently used
                row["busy"] = sum(p["busy"] for p in procs)  # processes a call holds
                row["running"] = any(p["running"] for p in procs)
                row["starts"] = sum(p["starts"] for p in procs)
                row["restarts"] = sum(p["restarts"] for p in procs)
                row["activeSessions"] = sum(p["activeSessions"] for p in procs)
                row["processes"] = len(procs)
            row["waiting"] = self._waiting[pid]  # calls waiting for a place (the cap)
            out.append(row)
        return out

    async def close(self) -> None:
        """Every process closed, one after the other, and forgotten."""
        for agent in list(self._agents.values()):
            await agent.close()
        self._agents.clear()
