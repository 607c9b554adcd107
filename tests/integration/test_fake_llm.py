"""The in-repo fake LLM that router, multi-agent, gateway and agent e2e tests rely on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from internal.peers.fake_llm import create_app, user_text


@pytest.fixture
async def llm() -> AsyncIterator[str]:
    server = TestServer(create_app(), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def test_user_text_skips_injected_context_and_timestamp() -> None:
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "[Mon 2026-11-30 01:52 UTC] hello there\nsecond"},
        {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> stuff"},
    ]
    assert user_text(messages) == "hello there\nsecond"
    assert user_text([{"role": "user", "content": [{"type": "text", "text": "parts"}]}]) == "parts"


async def test_plain_and_streamed_replies(llm: str) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "ping\nmore"}]}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{llm}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "fake-model"
        async with http.post(f"{llm}/v1/chat/completions", json=body) as resp:
            reply = await resp.json()
        assert reply["choices"][0]["message"]["content"] == "FAKE-LLM says: ping"
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(f"{llm}/v1/chat/completions", json=stream_body) as resp:
            raw = (await resp.read()).decode()
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "FAKE-LLM says: ping"
    assert "usage" in chunks[-1] and chunks[-1]["choices"] == []


async def test_script_tool_calls_errors_and_request_log(llm: str) -> None:
    body = {"messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as http:
        replies = [
            "scripted",
            {"tool_calls": [{"name": "read", "arguments": {"path": "a"}}]},
            {"status": 503, "body": "overloaded"},
        ]
        await http.post(f"{llm}/_script", json={"replies": replies})
        async with http.post(f"{llm}/v1/chat/completions", json=body) as resp:
            assert (await resp.json())["choices"][0]["message"]["content"] == "scripted"
        async with http.post(f"{llm}/v1/chat/completions", json=body) as resp:
            choice = (await resp.json())["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "read"
        headers = {"Authorization": "Bearer sk-test"}
        async with http.post(f"{llm}/v1/chat/completions", json=body, headers=headers) as resp:
            assert resp.status == 503
        async with http.get(f"{llm}/_requests") as resp:
            seen = await resp.json()
    assert len(seen) == 3
    assert seen[-1]["headers"]["Authorization"] == "Bearer sk-test"
