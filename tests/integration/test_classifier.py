"""The LLM routing classifier (routing.md §3) against the in-repo fake
OpenAI-compatible LLM: key/URL pairing (§9.1 fix), deadline, cache, sharing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from internal.peers.fake_llm import STATE_KEY, create_app
from tests.conftest import ServeApp, wait_until
from xwm_bridge.llm import normalize_base_url
from xwm_bridge.router.classifier import (
    SYSTEM_PROMPT,
    Classifier,
    Endpoint,
    choose_endpoint,
    label_from_response,
)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def make(http: aiohttp.ClientSession, **kw: Any) -> Classifier:
    opts: dict[str, Any] = {
        "model": "route-model",
        "timeout": 5.0,
        "cache_ttl": 60.0,
        "cache_entries": 8,
        "max_concurrency": 4,
    }
    opts.update(kw)
    return Classifier(http, **opts)


async def llm(serve_app: ServeApp) -> tuple[str, Any]:
    app = create_app()
    return await serve_app(app), app[STATE_KEY]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("", "https://api.openai.com/v1"),
        ("https://x/v1", "https://x/v1"),
        ("https://x/", "https://x/v1"),
        ("https://x//", "https://x/v1"),
        ("https://x/v1/", "https://x/v1/v1"),  # kept as documented
    ],
)
def test_normalize_base_url(raw: str, expected: str) -> None:
    assert normalize_base_url(raw) == expected


def test_server_key_never_goes_to_client_url() -> None:
    assert choose_endpoint("https://evil", "", "https://srv", "SERVER") == Endpoint(
        "https://srv/v1", "SERVER"
    )
    assert choose_endpoint("https://evil", "CLIENT", "https://srv", "SERVER") == Endpoint(
        "https://evil/v1", "CLIENT"
    )
    assert choose_endpoint("", "CLIENT", "https://srv/v1", "") == Endpoint(
        "https://srv/v1", "CLIENT"
    )
    assert choose_endpoint("https://evil", "", "https://srv", "") is None


@pytest.mark.parametrize(
    ("body", "label"),
    [
        (b'{"choices":[{"message":{"content":" Multi-Agent "}}]}', "multi-agent"),
        (b'{"choices":[{"message":{"content":"single-agent or gateway"}}]}', "single-agent"),
        (b'{"choices":[{"message":{"content":"GATEWAY"}}]}', "gateway"),
        (b'{"choices":[{"message":{"content":"dunno"}}]}', ""),
        (b'{"choices":[]}', ""),
        (b'{"choices":[{"message":{"content":null}}]}', ""),
        (b"{}", ""),
        (b"nope", ""),
    ],
)
def test_label_from_response(body: bytes, label: str) -> None:
    assert label_from_response(body) == label


async def test_request_shape_and_answer(serve_app: ServeApp, client: aiohttp.ClientSession) -> None:
    url, state = await llm(serve_app)
    state.script.append("multi-agent")
    c = make(client)
    assert await c.classify("  plan my week  ", Endpoint(f"{url}/v1", "KEY")) == "multi-agent"
    (req,) = state.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer KEY"
    assert req["body"] == {
        "model": "route-model",
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "plan my week"},
        ],
        "max_tokens": 4096,
        "stream": False,
    }


async def test_cache_per_prompt_and_ttl(serve_app: ServeApp, client: aiohttp.ClientSession) -> None:
    url, state = await llm(serve_app)
    now = [1000.0]
    c = make(client, cache_ttl=30, clock=lambda: now[0])
    ep = Endpoint(f"{url}/v1", "KEY")
    # the fake echoes the prompt, so a prompt naming a label gets that label back
    assert await c.classify("go gateway", ep) == "gateway"
    assert await c.classify("go gateway", ep) == "gateway"
    assert len(state.requests) == 1
    assert await c.classify("go single-agent", ep) == "single-agent"
    assert len(state.requests) == 2
    now[0] += 29.9  # just inside the TTL: still cached
    assert await c.classify("go gateway", ep) == "gateway"
    assert len(state.requests) == 2
    now[0] += 0.1  # the TTL has passed: asked again
    assert await c.classify("go gateway", ep) == "gateway"
    assert len(state.requests) == 3


async def test_no_answer_is_not_cached(serve_app: ServeApp, client: aiohttp.ClientSession) -> None:
    url, state = await llm(serve_app)
    state.script.append({"status": 500, "body": "boom"})
    c = make(client)
    ep = Endpoint(f"{url}/v1", "KEY")
    assert await c.classify("go gateway", ep) == ""
    assert await c.classify("go gateway", ep) == "gateway"


async def test_deadline(serve_app: ServeApp, client: aiohttp.ClientSession) -> None:
    url, _ = await llm(serve_app)
    c = make(client, timeout=0.3)
    started = time.monotonic()
    assert await c.classify("slow:3000 gateway", Endpoint(f"{url}/v1", "KEY")) == ""
    assert time.monotonic() - started < 2


async def test_concurrent_identical_prompts_share_one_call(
    serve_app: ServeApp, client: aiohttp.ClientSession
) -> None:
    url, state = await llm(serve_app)
    c = make(client)
    ep = Endpoint(f"{url}/v1", "KEY")
    labels = await asyncio.gather(*(c.classify("slow:200 multi-agent", ep) for _ in range(5)))
    assert labels == ["multi-agent"] * 5
    assert len(state.requests) == 1


async def test_unreachable_endpoint_is_no_answer(client: aiohttp.ClientSession) -> None:
    from tests.conftest import closed_port

    c = make(client, timeout=2)
    assert (
        await c.classify("x gateway", Endpoint(f"http://127.0.0.1:{closed_port()}/v1", "K")) == ""
    )
    assert await c.classify("x", None) == ""


async def test_a_long_classifier_reply_is_read_to_its_end(
    client: aiohttp.ClientSession, serve_app: ServeApp
) -> None:
    """issue 16 item 2: ``content.read(n)`` stopped at what was buffered (~100 KB)."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        content = " " * 300_000 + "multi-agent"  # the label is at the very end
        return web.json_response({"choices": [{"message": {"content": content}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    url = await serve_app(app)
    label = await make(client).classify("task", Endpoint(f"{url}/v1", "KEY"))
    assert label == "multi-agent"


def classifier_tasks() -> list[asyncio.Task[Any]]:
    """Tasks running a classifier call (whoever owns them)."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and "Classifier." in getattr(t.get_coro(), "__qualname__", "")
    ]


async def test_a_shared_call_goes_on_when_the_turn_that_started_it_is_cancelled(
    serve_app: ServeApp, client: aiohttp.ClientSession
) -> None:
    """The second of two identical questions lost the classification (``""``, its
    turn fell back) when the first one's turn was cancelled mid-call."""
    url, state = await llm(serve_app)
    c = make(client)
    ep = Endpoint(f"{url}/v1", "KEY")
    first = asyncio.ensure_future(c.classify("slow:300 multi-agent", ep))
    second = asyncio.ensure_future(c.classify("slow:300 multi-agent", ep))
    await wait_until(lambda: len(state.requests) == 1)  # both wait on the one call
    first.cancel()
    assert await asyncio.wait_for(second, 10) == "multi-agent"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert len(state.requests) == 1  # one call, carried on for the second
    assert c._inflight == {} and classifier_tasks() == []
    # and its answer was cached as usual
    assert await c.classify("slow:300 multi-agent", ep) == "multi-agent"
    assert len(state.requests) == 1


async def test_a_shared_call_is_cancelled_when_no_one_waits_for_it(
    serve_app: ServeApp, client: aiohttp.ClientSession
) -> None:
    url, state = await llm(serve_app)
    c = make(client)
    ep = Endpoint(f"{url}/v1", "KEY")
    waiters = [asyncio.ensure_future(c.classify("slow:3000 gateway", ep)) for _ in range(2)]
    await wait_until(lambda: len(state.requests) == 1)
    for w in waiters:
        w.cancel()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert c._inflight == {}
    await wait_until(lambda: classifier_tasks() == [], within=2)  # not the 3 s answer
    assert not c._cache  # a cancelled call is no answer to keep
    assert len(state.requests) == 1


async def test_close_ends_a_shared_call_and_its_waiters_get_no_answer(
    serve_app: ServeApp, client: aiohttp.ClientSession
) -> None:
    url, state = await llm(serve_app)
    c = make(client)
    ep = Endpoint(f"{url}/v1", "KEY")
    waiter = asyncio.ensure_future(c.classify("slow:3000 gateway", ep))
    await wait_until(lambda: len(state.requests) == 1)
    await asyncio.wait_for(c.close(), 5)
    assert await asyncio.wait_for(waiter, 5) == ""  # no answer, not a cancelled turn
    assert c._inflight == {} and classifier_tasks() == []
    assert await c.classify("gateway", ep) == ""  # closed: no new call
    assert len(state.requests) == 1


async def test_the_classifier_deadline_is_the_only_one(serve_app: ServeApp) -> None:
    """``router.classifier_timeout`` bounds the call, and nothing shorter does: the
    shared session's defaults (aiohttp's 300 s total, 30 s connect; here a 0.1 s
    total) cut a call the configured deadline still allowed, and it answered nothing."""
    from aiohttp import web

    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(0.4)  # a model that answers past the session's total
        return web.json_response({"choices": [{"message": {"content": "gateway"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow)
    base = await serve_app(app)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as http:
        c = make(http, timeout=30.0)
        assert await c.classify("hello", Endpoint(f"{base}/v1", "k")) == "gateway"
