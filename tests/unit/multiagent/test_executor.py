"""``MultiAgentExecutor``'s host check of a client's own ``aiGatewayBaseUrl``."""

from __future__ import annotations

import dataclasses

import aiohttp

from xwm_bridge.config import BridgeConfig
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
