"""Start a stdio agent, ``initialize`` it within a deadline, stop it: is it usable?

Used by ``doctor`` (one probe per stdio provider) and reusable by anything that
must check an agent without running a turn. The agent is started exactly as for
turns (clean environment, sandbox), so a probe that passes means a turn can start.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from xwm_bridge.config import BridgeConfig, ProviderConfig
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, AgentSpec
from xwm_bridge.providers.stdio.features import AgentFeatures
from xwm_bridge.providers.stdio.launch import agent_spec
from xwm_bridge.tasks import wait_for


@dataclass(frozen=True, slots=True)
class ProbeResult:
    provider: str
    ok: bool
    error: str = ""
    init: dict[str, Any] = dataclasses.field(default_factory=dict)
    elapsed_ms: float = 0.0

    @property
    def detail(self) -> str:
        if not self.ok:
            return self.error
        info = self.init.get("agentInfo")
        info = info if isinstance(info, dict) else {}
        name = info.get("name") or "agent"
        version = f" {info['version']}" if info.get("version") else ""
        features = AgentFeatures.of(self.init)
        return (
            f"{name}{version} answered initialize (protocol {self.init.get('protocolVersion')}, "
            f"authMethods: {features.describe_auth()}) in {self.elapsed_ms:.0f} ms"
        )


async def probe_spec(spec: AgentSpec, deadline: float) -> ProbeResult:
    """``initialize`` the agent of ``spec`` within ``deadline`` seconds, then stop it."""
    spec = dataclasses.replace(spec, initialize_timeout=min(spec.initialize_timeout, deadline))
    agent = AcpAgent(spec)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        init = await wait_for(agent.ensure_started(), deadline + 1)
    except AgentError as exc:
        await agent.close()  # stops the group; the stdout reader records how it ended
        error = str(exc)
        if not exc.timed_out and agent.last_exit and agent.last_exit not in error:  # it died
            error += f" ({agent.last_exit})"
        return ProbeResult(spec.name, False, error)
    except TimeoutError:
        await agent.close()
        return ProbeResult(spec.name, False, f"no initialize answer within {deadline:g}s")
    await agent.close()
    return ProbeResult(spec.name, True, init=init, elapsed_ms=(loop.time() - started) * 1000)


async def probe(provider: ProviderConfig, config: BridgeConfig) -> ProbeResult:
    try:
        spec = agent_spec(provider, config)
    except AgentError as exc:  # e.g. the sandbox is not installed
        return ProbeResult(provider.id, False, str(exc))
    return await probe_spec(spec, config.agents.probe_timeout)
