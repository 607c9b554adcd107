"""Drive ``xwm-bridge toolbridge`` with the official ``mcp`` Python client over stdio."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.conftest import ROOT, base_env

TOOLBRIDGE_VARS = (
    "LLM_",
    "CLAUDE_",
    "VAULT_",
)


def toolbridge_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in base_env().items() if not k.startswith(TOOLBRIDGE_VARS)}
    env.update(extra)
    return env


@asynccontextmanager
async def mcp_session(
    env: dict[str, str], *args: str, mode: tuple[str, ...] = ("toolbridge",)
) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "xwm_bridge", *mode, *args],
        env=env,
        cwd=str(ROOT),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session
