"""The executor interface, and executors for targets whose backend is not part of this build.

They answer exactly as the original does when that backend is absent
(forwarding.md §6-7), so a client sees a clean ``success:false`` result and
never a hang; ``acp.capabilities`` does not advertise them.
"""

from __future__ import annotations

from typing import Any, Protocol

from xwm_bridge.core.context import TurnContext

CANCELLED = "turn cancelled"


class Executor(Protocol):
    async def execute(self, ctx: TurnContext) -> dict[str, Any]: ...

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]: ...


class GatewayUnavailableExecutor:
    """Gateway-mode turn with no gateway runtime: ``gateway not connected`` (§7)."""

    MODE = "gateway-chat"
    MESSAGE = "gateway not connected"

    async def execute(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit_error(self.MESSAGE)
        return {"success": False, "error": self.MESSAGE, "turnId": ctx.turn_id, "mode": self.MODE}

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]:
        await ctx.emit_error(CANCELLED)
        return {
            "success": False,
            "error": CANCELLED,
            "cancelled": True,
            "turnId": ctx.turn_id,
            "mode": self.MODE,
        }
