"""The interface every turn executor implements (single-agent, stdio agent,
multi-agent, gateway): run the turn, or build the result of a cancelled one."""

from __future__ import annotations

from typing import Any, Protocol

from xwm_bridge.core.context import TurnContext

CANCELLED = "turn cancelled"


class Executor(Protocol):
    async def execute(self, ctx: TurnContext) -> dict[str, Any]: ...

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]: ...
