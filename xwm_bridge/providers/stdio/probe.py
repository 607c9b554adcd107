"""Is this stdio ACP agent usable? Start it, run ``initialize`` with a deadline, stop it.

Used by ``xwm-bridge doctor``: a command that merely resolves on ``PATH`` is not
an agent that answers. The probe starts the real process (own process group,
the provider's ``env`` and ``cwd``), so it costs what the agent's start costs;
the whole group is stopped afterwards whatever happened.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.providers.stdio.agent import AcpAgent, AgentError, AgentSpec


@dataclass(frozen=True, slots=True)
class AgentProbe:
    ok: bool
    #: what answered, e.g. ``initialize ok: opencode 1.18.33 (protocol 1)``
    detail: str = ""
    error: str = ""
    #: the ``initialize`` result when it answered
    init: dict[str, Any] = field(default_factory=dict)


def describe(init: dict[str, Any]) -> str:
    info = init.get("agentInfo")
    info = info if isinstance(info, dict) else {}
    name = coerce.text(info.get("name")) or coerce.text(info.get("title")) or "agent"
    version = coerce.text(info.get("version"))
    protocol = init.get("protocolVersion")
    who = f"{name} {version}".strip()
    return f"initialize ok: {who} (protocol {protocol})"


async def probe_agent(spec: AgentSpec, deadline_s: float) -> AgentProbe:
    """Start the agent described by ``spec`` and ask ``initialize`` within
    ``deadline_s`` seconds; never raises for an agent problem (the answer says what
    failed: the exit status and the end of its stderr when it died)."""
    agent = AcpAgent(dataclasses.replace(spec, initialize_timeout=deadline_s))
    try:
        init = await asyncio.wait_for(agent.ensure_started(), deadline_s + 5)
    except AgentError as exc:
        error = str(exc)
    except TimeoutError:
        error = f"agent {spec.name} did not start within {deadline_s:g}s"
    else:
        await agent.close()
        return AgentProbe(True, detail=describe(init), init=init)
    await agent.close()  # stops the group; the stdout reader records how it ended
    if agent.last_exit and agent.last_exit not in error:
        error += f" ({agent.last_exit})"
    return AgentProbe(False, error=error)
