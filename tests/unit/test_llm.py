"""``xwm_bridge.llm``: failures of a completion are :class:`LLMError` with a clear text."""

from __future__ import annotations

import aiohttp
import pytest

from xwm_bridge.llm import ChatRequest, LLMError, complete


@pytest.mark.parametrize(
    "base_url",
    [
        # aiohttp refused these with a bare ValueError (Authorization header plus URL
        # credentials), which escaped the executor: -32603 and a traceback
        "http://user:hunter2@127.0.0.1:9/v1",
        "https://:hunter2@llm.example.com",
        # an unsupported scheme: aiohttp's error text was the URL, credentials included
        "ftp://user:hunter2@127.0.0.1/",
    ],
)
async def test_a_base_url_with_credentials_is_an_llm_error_that_hides_them(
    base_url: str,
) -> None:
    req = ChatRequest(base_url, "sk-key", "m", [{"role": "user", "content": "hi"}], 5)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(LLMError) as caught:
            await complete(http, req)
    assert str(caught.value) == "llm request failed: the base URL must not carry credentials"
    assert "hunter2" not in str(caught.value)
