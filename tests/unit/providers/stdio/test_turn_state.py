"""TurnState: the request hook is tried first; NOT_HANDLED falls through."""

from __future__ import annotations

from typing import Any

import pytest

from xwm_bridge.config import BridgeConfig
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.permissions import PermissionBroker
from xwm_bridge.providers.stdio.policy import PolicyStore
from xwm_bridge.providers.stdio.terminal import Terminals
from xwm_bridge.providers.stdio.turn_state import NOT_HANDLED, TurnState

pytestmark = pytest.mark.asyncio


class Owner:
    def __init__(self) -> None:
        self.config = BridgeConfig()
        self.broker = PermissionBroker()
        self.policy = PolicyStore(())
        self.terminals = Terminals(self.config.agents)


async def test_request_hook_first_then_the_bridge() -> None:
    seen: list[str] = []

    async def hook(method: str, params: dict[str, Any]) -> Any:
        seen.append(method)
        return {"content": "relayed"} if method == "fs/read_text_file" else NOT_HANDLED

    state = TurnState(ctx=None, cwd="/nowhere", owner=Owner(), request_hook=hook)  # type: ignore[arg-type]
    assert await state.on_request("fs/read_text_file", {"path": "/x"}) == {"content": "relayed"}
    with pytest.raises(ClientError) as info:  # fell through: no allowed root for /nowhere
        await state.on_request("fs/write_text_file", {"path": "/nowhere/x", "content": ""})
    assert "not allowed" in info.value.message
    with pytest.raises(ClientError, match="not supported"):
        await state.on_request("x/unknown", {})
    assert seen == ["fs/read_text_file", "fs/write_text_file", "x/unknown"]
