"""The interface every turn executor implements (single-agent, stdio agent,
multi-agent, gateway): run the turn, or build the result of a cancelled one."""

from __future__ import annotations

from typing import Any, Protocol

from xwm_bridge.core.context import TurnContext

CANCELLED = "turn cancelled"


class Executor(Protocol):
    """``execute`` runs in the task a client's cancel cancels; one that catches that
    cancel to clean up before re-raising calls :func:`~xwm_bridge.core.handles.cancel_arrived`
    first, else the cancel is sent again into its cleanup (``TurnHandle``)."""

    async def execute(self, ctx: TurnContext) -> dict[str, Any]: ...

    async def cancelled(self, ctx: TurnContext) -> dict[str, Any]: ...
