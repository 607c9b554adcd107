"""Which agent process serves a turn (providers/stdio/executor.py ``agent``)."""

from __future__ import annotations

import sys
from pathlib import Path

from xwm_bridge.config import AgentsConfig, BridgeConfig, ProviderConfig
from xwm_bridge.providers.stdio.executor import StdioAgentExecutor
from xwm_bridge.providers.stdio.permissions import PermissionBroker


def executor(sandbox: str) -> StdioAgentExecutor:
    provider = ProviderConfig("gem", kind="stdio", command=(sys.executable, "-V"))
    # bwrap_path: any executable (the argv is only built here, never run)
    agents = AgentsConfig(sandbox=sandbox, bwrap_path=sys.executable)
    return StdioAgentExecutor(
        BridgeConfig(providers=(provider,), agents=agents), PermissionBroker()
    )


def test_a_protocol_version_set_for_a_provider_reaches_each_of_its_processes(
    tmp_path: Path,
) -> None:
    """agent-adapter's GEMINI_ADAPTER_PROTOCOL_VERSION: under bwrap a process runs per
    working directory, and those the turns started kept the default version."""
    for sandbox in ("", "bwrap"):
        ex = executor(sandbox)
        first = ex.agent("gem")
        ex.set_protocol_version("gem", 2)
        assert first.spec.protocol_version == 2  # one that exists already
        later = ex.agent("gem", str(tmp_path / "project"))  # and one started later
        assert later.spec.protocol_version == 2, sandbox
        assert (later is first) is (sandbox == "")
