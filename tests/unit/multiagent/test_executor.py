"""``MultiAgentExecutor``'s host check of a client's own ``aiGatewayBaseUrl``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, cast

import aiohttp
import pytest

from xwm_bridge.config import BridgeConfig
from xwm_bridge.llm import LLMError
from xwm_bridge.multiagent.executor import MultiAgentExecutor


async def test_the_default_base_url_is_checked_like_any_other() -> None:
    """No ``aiGatewayBaseUrl`` means ``https://api.openai.com/v1``: allowed by the
    default policy (it is the toolbridge's configured endpoint), refused by a list
    that does not name it; before, an empty URL skipped the check altogether."""
    default = BridgeConfig()
    listed = dataclasses.replace(
        default,
        multi_agent=dataclasses.replace(default.multi_agent, allowed_hosts=("127.0.0.1",)),
    )
    client = {"aiGatewayApiKey": "sk-client"}
    async with aiohttp.ClientSession() as http:
        assert MultiAgentExecutor(default, http)._refused_host(client, "") == ""
        assert MultiAgentExecutor(listed, http)._refused_host(client, "") == "api.openai.com"
        assert MultiAgentExecutor(listed, http)._refused_host(client, "http://127.0.0.1:9") == ""
        # the server's own key and URL are not a client's choice
        assert MultiAgentExecutor(listed, http)._refused_host({}, "") == ""


async def test_a_cancel_while_a_failed_round_winds_down_stays_a_cancel() -> None:
    """Worker 1 fails; while worker 2 is still tearing down its request the client
    cancels. The TaskGroup gives errors priority over the cancel, so the turn ended
    as worker 1's ``LLMError`` (an ``api error`` result, not ``turn cancelled``)."""
    cfg = BridgeConfig()
    cfg = dataclasses.replace(cfg, multi_agent=dataclasses.replace(cfg.multi_agent, workers=2))
    w2_running, tearing_down, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def call(messages: list[dict[str, str]]) -> str:
        if "worker 1 of 2" in messages[1]["content"]:
            await w2_running.wait()
            raise LLMError("api error 500: boom")
        w2_running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            tearing_down.set()
            await release.wait()  # the HTTP request being torn down
            raise
        return "never"

    async with aiohttp.ClientSession() as http:
        executor = MultiAgentExecutor(cfg, http)
        work = executor._work(cast(Any, None), call, "task", "plan", 1, "", "")
        task = asyncio.create_task(work)
        await asyncio.wait_for(tearing_down.wait(), 5)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


async def test_a_failed_round_without_a_cancel_is_the_workers_error() -> None:
    cfg = BridgeConfig()
    cfg = dataclasses.replace(cfg, multi_agent=dataclasses.replace(cfg.multi_agent, workers=2))

    async def call(messages: list[dict[str, str]]) -> str:
        if "worker 1 of 2" in messages[1]["content"]:
            raise LLMError("api error 500: boom")
        await asyncio.Event().wait()  # cancelled by the group
        return "never"

    async with aiohttp.ClientSession() as http:
        work = MultiAgentExecutor(cfg, http)._work(cast(Any, None), call, "t", "p", 1, "", "")
        with pytest.raises(LLMError, match="boom"):
            await asyncio.wait_for(work, 5)
