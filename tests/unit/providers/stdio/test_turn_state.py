"""TurnState: requests the calling client serves go to it; the rest to the bridge."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from xwm_bridge.config import BridgeConfig
from xwm_bridge.providers.stdio.agent import ClientError
from xwm_bridge.providers.stdio.permissions import PermissionBroker
from xwm_bridge.providers.stdio.policy import PolicyStore
from xwm_bridge.providers.stdio.terminal import Terminals
from xwm_bridge.providers.stdio.turn_state import TurnState

pytestmark = pytest.mark.asyncio


class Owner:
    def __init__(self) -> None:
        self.config = BridgeConfig()
        self.broker = PermissionBroker()
        self.policy = PolicyStore(())
        self.terminals = Terminals(self.config.agents)


class Client:
    """An ACP client that serves fs/read_text_file only."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def serves(self, method: str) -> bool:
        self.seen.append(method)
        return method == "fs/read_text_file"

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        return {"content": "relayed"}


class Ctx:
    def __init__(self, client: Client | None) -> None:
        self.client = client


async def test_the_calling_client_first_then_the_bridge() -> None:
    client = Client()
    state = TurnState(ctx=Ctx(client), cwd="/nowhere", owner=Owner())  # type: ignore[arg-type]
    assert await state.on_request("fs/read_text_file", {"path": "/x"}) == {"content": "relayed"}
    with pytest.raises(ClientError) as info:  # not the client's: no allowed root for /nowhere
        await state.on_request("fs/write_text_file", {"path": "/nowhere/x", "content": ""})
    assert "not allowed" in info.value.message
    with pytest.raises(ClientError, match="not supported"):
        await state.on_request("x/unknown", {})
    assert client.seen == ["fs/read_text_file", "fs/write_text_file", "x/unknown"]


async def test_without_a_client_the_bridge_serves_everything() -> None:
    state = TurnState(ctx=Ctx(None), cwd="/nowhere", owner=Owner())  # type: ignore[arg-type]
    with pytest.raises(ClientError) as info:
        await state.on_request("fs/read_text_file", {"path": "/nowhere/x"})
    assert "not allowed" in info.value.message


async def test_a_nul_in_an_agents_path_or_command_is_invalid_params(tmp_path: Path) -> None:
    """Paths and commands no OS call accepts are ``-32602``, not an internal error."""
    owner = Owner()
    owner.config = BridgeConfig(allowed_roots=(str(tmp_path),))
    owner.config = dataclasses.replace(
        owner.config, agents=dataclasses.replace(owner.config.agents, terminal_enabled=True)
    )
    owner.terminals = Terminals(owner.config.agents)
    state = TurnState(ctx=Ctx(None), cwd=str(tmp_path), owner=owner)  # type: ignore[arg-type]
    bad = f"{tmp_path}/a\0b"
    requests: list[tuple[str, dict[str, Any]]] = [
        ("fs/read_text_file", {"path": bad}),
        ("fs/write_text_file", {"path": bad, "content": "x"}),
        ("terminal/create", {"sessionId": "s", "command": "true", "cwd": bad}),
        ("terminal/create", {"sessionId": "s", "command": "tr\0ue"}),
        ("terminal/create", {"sessionId": "s", "command": "true", "args": ["a\0"]}),
    ]
    for method, params in requests:
        with pytest.raises(ClientError) as info:
            await state.on_request(method, params)
        assert info.value.code == -32602, (method, params, info.value.message)
    await owner.terminals.close()
