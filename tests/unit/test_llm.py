"""``xwm_bridge.llm``: failures of a completion are :class:`LLMError` with a clear text."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.conftest import ServeApp
from xwm_bridge.llm import (
    MAX_ERROR_BODY,
    ChatRequest,
    LLMError,
    LLMRefusal,
    complete,
    parse_choice,
    parse_completion,
)


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


KEY = "sk-quoted-0123456789"


def test_the_key_a_peer_quotes_is_masked() -> None:
    with pytest.raises(LLMError) as caught:
        parse_completion(401, f"Incorrect API key provided: {KEY}".encode(), KEY)
    assert str(caught.value) == "api error 401: Incorrect API key provided: [REDACTED]"
    ok = b'{"choices": [{"message": {"content": "your key is ' + KEY.encode() + b'"}}]}'
    assert parse_completion(200, ok, KEY) == "your key is [REDACTED]"


def test_a_key_across_the_error_body_cut_leaves_no_prefix() -> None:
    body = "x" * (MAX_ERROR_BODY - 5) + KEY
    with pytest.raises(LLMError) as caught:
        parse_completion(500, body.encode(), KEY)
    assert KEY[:5] not in str(caught.value)


def test_a_key_too_short_to_mask_leaves_the_text() -> None:
    ok = b'{"choices": [{"message": {"content": "a b c"}}]}'
    assert parse_completion(200, ok, "a") == "a b c"


def test_the_finish_reason_comes_with_the_answer() -> None:
    choice = {"message": {"content": " cut "}, "finish_reason": "length"}
    assert parse_choice(200, orjson.dumps({"choices": [choice]})) == ("cut", "length")
    # absent or not a string: none
    for finish in (None, 3):
        raw = orjson.dumps({"choices": [{**choice, "finish_reason": finish}]})
        assert parse_choice(200, raw) == ("cut", "")


def test_an_empty_filtered_answer_is_a_refusal() -> None:
    # finish_reason content_filter and no text: the model refused, not a broken peer
    for message in ({"content": None}, {"content": "  "}, {}):
        raw = orjson.dumps({"choices": [{"message": message, "finish_reason": "content_filter"}]})
        with pytest.raises(LLMRefusal, match=r"^empty response content"):
            parse_choice(200, raw)
    # empty for another reason: an error, not a refusal
    raw = orjson.dumps({"choices": [{"message": {}, "finish_reason": "stop"}]})
    with pytest.raises(LLMError) as caught:
        parse_choice(200, raw)
    assert not isinstance(caught.value, LLMRefusal)


async def test_the_call_deadline_is_the_only_one(serve_app: ServeApp) -> None:
    """``req.timeout`` bounds the whole exchange, and nothing shorter does: the shared
    session's default total (aiohttp's 300 s, here 0.1 s) cut a call its configured
    deadline (``multi_agent.call_timeout``, ``toolbridge.chat_timeout``) still allowed,
    and the failure named that deadline (``timed out after 30s``)."""

    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(0.5)  # a model that answers past the session's default
        return web.json_response({"choices": [{"message": {"content": "late but fine"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    base = await serve_app(app)
    req = ChatRequest(base, "sk-key", "m", [{"role": "user", "content": "hi"}], 30)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as http:
        assert await complete(http, req) == "late but fine"
