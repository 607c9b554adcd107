"""Multi-agent turns: a real planner → worker → reviewer loop against the fake LLM
(forwarding.md §6, ARCHITECTURE.md §2 fix), streamed as ``step`` updates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from internal.peers.fake_llm import create_app
from tests.conftest import ServeApp, StartBridge, base_env, eventually, rpc, sse, updates

TOKEN_ENV = {"ACP_AUTH_TOKEN": "test-token-0123456789"}
ROUTE = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}


@pytest.fixture
async def llm_url(serve_app: ServeApp) -> str:
    return await serve_app(create_app())


def params(session_id: str, llm_url: str, prompt: str = "write a haiku", **extra: Any) -> Any:
    return {
        "sessionId": session_id,
        "taskPrompt": prompt,
        "routing": ROUTE,
        "aiGatewayApiKey": "sk-client",
        "aiGatewayBaseUrl": llm_url,
        "model": "team-model",
        **extra,
    }


async def script(http: aiohttp.ClientSession, llm_url: str, *replies: Any) -> None:
    async with http.post(f"{llm_url}/_script", json={"replies": list(replies)}) as resp:
        assert resp.status == 200


async def seen(http: aiohttp.ClientSession, llm_url: str) -> list[dict[str, Any]]:
    async with http.get(f"{llm_url}/_requests") as resp:
        out: list[dict[str, Any]] = orjson.loads(await resp.read())
        return out


def steps(events: list[Any]) -> list[tuple[str, str, int, float]]:
    return [
        (u["title"], u["role"], u["iteration"], u["score"])
        for u in updates(events)
        if u.get("type") == "step"
    ]


async def test_reviewer_rejects_then_accepts(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str
) -> None:
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    await script(
        http,
        llm_url,
        "1. pick a season\n2. write three lines",
        "draft one",
        "Too long and no season word.\nSCORE: 4/10",
        "draft two",
        "Good now.\n**Score:** 9 / 10",
    )
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-1", llm_url)), 20
    )
    assert steps(events) == [
        ("Planner", "architect", 1, 0),
        ("Planner", "architect", 1, 0),
        ("Worker", "engineer", 1, 0),
        ("Reviewer", "tester", 1, 4),
        ("Worker", "engineer", 2, 0),
        ("Reviewer", "tester", 2, 9),
    ]
    ups = updates(events)
    assert ups[1]["message"] == "Preparing multi-agent run"
    assert [u["seq"] for u in ups] == list(range(1, len(ups) + 1))
    assert all(u["mode"] == "multi-agent" and u["pending"] is False for u in ups[1:])
    result = events[-1]["result"]
    assert result["success"] is True
    assert result["summary"] == "draft two"
    assert result["finalScore"] == 9
    assert result["iterations"] == 2
    assert result["approved"] is True
    assert result["mode"] == "multi-agent"
    assert result["turnId"] == ups[0]["turnId"]
    assert result["resolvedExecutionTarget"] == "multi-agent"

    requests = await seen(http, llm_url)
    assert len(requests) == 5
    assert all(r["headers"]["Authorization"] == "Bearer sk-client" for r in requests)
    assert all(r["body"]["model"] == "team-model" for r in requests)
    planner, _, _, rework, _ = (r["body"]["messages"] for r in requests)
    assert planner[1]["content"] == "## User Turn 1\nwrite a haiku"  # §6.1 history form
    # the rework carries the previous draft and the reviewer's feedback
    assert "draft one" in rework[1]["content"]
    assert "Too long and no season word." in rework[1]["content"]


async def test_bounded_iterations_keep_best_draft(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV),
        config={"multi_agent": {"max_iterations": 2, "score_threshold": 7}},
        tmp=tmp_path,
    )
    await script(http, llm_url, "plan", "d1", "meh SCORE: 5/10", "d2", "worse. Score: 3")
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-2", llm_url)), 20
    )
    result = events[-1]["result"]
    assert result["success"] is True
    assert result["approved"] is False
    assert result["iterations"] == 2
    assert result["summary"] == "d1"
    assert result["finalScore"] == 5
    assert len(await seen(http, llm_url)) == 5


async def test_parallel_workers(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"workers": 2}}, tmp=tmp_path
    )
    # both workers take 1 s each: run in parallel the turn takes ~1 s, not 2 s
    slow_a = {"content": "part A", "delay_ms": 1000}
    slow_b = {"content": "part B", "delay_ms": 1000}
    await script(http, llm_url, "1. a\n2. b", slow_a, slow_b, "fine SCORE: 10/10")
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-3", llm_url)), 20
    )
    assert loop.time() - started < 1.9
    workers = [u for u in updates(events) if u.get("title") == "Worker"]
    assert sorted(u["worker"] for u in workers) == [1, 2]
    result = events[-1]["result"]
    assert result["success"] is True and result["finalScore"] == 10
    assert result["summary"].startswith("## Worker 1\n")
    assert "## Worker 2\n" in result["summary"]
    assert {"part A", "part B"} <= set(result["summary"].split("\n"))


async def test_llm_error_is_a_failure_result(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str
) -> None:
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    await script(http, llm_url, "plan", {"status": 500, "body": "boom\n"})
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-4", llm_url)), 20
    )
    last = updates(events)[-1]
    assert last == {**last, "type": "status", "message": "api error 500: boom", "error": True}
    assert "event" not in last
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "api error 500: boom"
    assert result["mode"] == "multi-agent"


async def test_a_later_rounds_failure_keeps_the_best_reviewed_draft(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    """Round 1 was drafted and reviewed (5/10); round 2's worker call failed. The
    failure result carried only the error: the reviewed draft, its score and the plan
    were gone from the answer (the client had them only as step updates)."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV),
        config={"multi_agent": {"max_iterations": 3, "score_threshold": 7}},
        tmp=tmp_path,
    )
    await script(http, llm_url, "plan", "d1", "meh SCORE: 5/10", {"status": 500, "body": "boom\n"})
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-late", llm_url)), 20
    )
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "api error 500: boom"
    assert result["summary"] == "d1"
    assert result["finalScore"] == 5
    assert result["iterations"] == 1  # the rounds reviewed before the failure
    assert result["approved"] is False
    assert result["plan"] == "plan"
    # a failure before any review keeps the old shape: nothing to keep
    await script(http, llm_url, "plan", {"status": 500, "body": "boom\n"})
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-early", llm_url)), 20
    )
    early = events[-1]["result"]
    assert early["success"] is False and "summary" not in early and "finalScore" not in early


async def test_server_key_only_goes_to_server_url(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    """No client key: the server's key is used with the server's URL, never the client's."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV, XWM_MULTI_AGENT_API_KEY="sk-server"),
        config={"multi_agent": {"base_url": llm_url, "max_iterations": 1}},
        tmp=tmp_path,
    )
    p = params("ma-5", "http://127.0.0.1:9/evil")
    del p["aiGatewayApiKey"]
    await script(http, llm_url, "plan", "draft", "SCORE: 8/10")
    events = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", p), 20)
    assert events[-1]["result"]["success"] is True
    requests = await seen(http, llm_url)
    assert len(requests) == 3
    assert {r["headers"]["Authorization"] for r in requests} == {"Bearer sk-server"}


HOST_REFUSED = (
    "aiGatewayBaseUrl host is not allowed for multi-agent mode (multi_agent.allowed_hosts)"
)


async def test_a_client_url_off_loopback_is_refused_without_a_dial(
    start_bridge: StartBridge, http: aiohttp.ClientSession
) -> None:
    """The client's own key went to whatever URL it named: the bridge dialed into
    its own network for any client (SSRF). Now only loopback and the configured
    endpoints, unless multi_agent.allowed_hosts says otherwise."""
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    far = "http://198.51.100.7:9/v1"  # TEST-NET-2: a dial would hang until the deadline
    async with asyncio.timeout(5):
        events = await sse(http, bridge.rpc_url, "session.start", params("ma-h1", far))
    result = events[-1]["result"]
    assert result["success"] is False and result["error"] == HOST_REFUSED
    assert updates(events)[-1]["message"] == HOST_REFUSED


@pytest.mark.parametrize(
    ("allowed", "ok"), [(["127.0.0.1"], True), (["*"], True), (["llm.example.com"], False)]
)
async def test_allowed_hosts_replace_the_default(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    llm_url: str,
    tmp_path: Path,
    allowed: list[str],
    ok: bool,
) -> None:
    """A list names every host a client URL may use: loopback is in it only if listed."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV),
        config={"multi_agent": {"allowed_hosts": allowed, "max_iterations": 1}},
        tmp=tmp_path,
    )
    await script(http, llm_url, "plan", "draft", "SCORE: 9/10")
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-h2", llm_url)), 20
    )
    result = events[-1]["result"]
    assert result["success"] is ok, result
    assert len(await seen(http, llm_url)) == (3 if ok else 0)
    if not ok:
        assert result["error"] == HOST_REFUSED


async def test_cancel_mid_loop(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str
) -> None:
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    # the worker's call hangs: the cancel must abort it
    await script(http, llm_url, "plan", {"content": "late draft", "delay_ms": 30000})
    task = asyncio.create_task(sse(http, bridge.rpc_url, "session.start", params("ma-6", llm_url)))

    async def worker_called() -> bool:  # the planner answered; the worker's call hangs
        return len(await seen(http, llm_url)) >= 2

    await eventually(worker_called)
    loop = asyncio.get_running_loop()
    started = loop.time()
    reply = await rpc(http, bridge.rpc_url, "session.cancel", {"sessionId": "ma-6"}, rid=9)
    assert reply["result"] == {"accepted": True, "cancelled": True}
    events = await asyncio.wait_for(task, 10)
    assert loop.time() - started < 5
    assert [s[0] for s in steps(events)] == ["Planner", "Planner"]
    last = updates(events)[-1]
    assert last["message"] == "turn cancelled" and last["error"] is True
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["cancelled"] is True
    assert result["mode"] == "multi-agent"
    # the session works again afterwards
    await script(http, llm_url, "plan", "d", "SCORE: 9/10")
    again = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.message", params("ma-6", llm_url)), 20
    )
    assert again[-1]["result"]["success"] is True


async def test_each_call_has_a_deadline(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"call_timeout": 0.5}}, tmp=tmp_path
    )
    await script(http, llm_url, "plan", {"content": "never in time", "delay_ms": 10000})
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-7", llm_url)), 20
    )
    assert loop.time() - started < 5
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "llm request timed out after 0.5s"
    assert updates(events)[-1]["message"] == "llm request timed out after 0.5s"


@pytest.mark.parametrize(
    ("key", "url_of", "error"),
    [
        (
            "sk-a\nb",  # aiohttp refuses the header with a bare ValueError
            lambda url: url,
            "llm request failed: Forbidden control character detected in headers. "
            "Potential header injection attack.",
        ),
        (
            "sk-client",  # credentials in the URL and a bearer: a bare ValueError too
            lambda url: url.replace("http://", "http://user:pw@"),
            "llm request failed: the base URL must not carry credentials",
        ),
    ],
)
async def test_client_input_aiohttp_refuses_is_a_failure_result(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    llm_url: str,
    key: str,
    url_of: Any,
    error: str,
) -> None:
    """A ValueError out of aiohttp escaped the executor: the caller got ``-32603
    internal error`` and the log a traceback, instead of the turn's failure result."""
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    p = params("ma-v", url_of(llm_url), aiGatewayApiKey=key)
    events = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", p), 20)
    assert "error" not in events[-1], events[-1]
    result = events[-1]["result"]
    assert result["success"] is False and result["error"] == error
    assert updates(events)[-1]["message"] == error
    assert await seen(http, llm_url) == []


async def test_a_redirect_is_not_followed_past_allowed_hosts(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    llm_url: str,
    serve_app: ServeApp,
    tmp_path: Path,
) -> None:
    """The client's URL passed the host check, then a 307 from it sent the request
    (method, body and, on the same host, the key) to any host: allowed_hosts were
    only checked for the first hop."""
    redirects: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        redirects.append(request.path)
        raise web.HTTPTemporaryRedirect(f"{llm_url}/v1/chat/completions")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", redirect)
    hop = await serve_app(app)
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV),
        config={"multi_agent": {"allowed_hosts": [hop.removeprefix("http://")]}},
        tmp=tmp_path,
    )
    await script(http, llm_url, "plan", "draft", "SCORE: 9/10")
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-r", hop)), 20
    )
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"].startswith("api error 307: ")
    assert redirects == ["/v1/chat/completions"]
    assert await seen(http, llm_url) == []


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ({"status": 429, "body": "rate limited\n"}, "api error 429: rate limited"),
        ({"status": 503, "body": ""}, "api error 503: "),
        ({"status": 200, "body": "not json"}, "invalid JSON response: "),
        ({"status": 200, "body": '{"id": "x"}'}, "missing choices in response"),
        ({"status": 200, "body": '{"choices": []}'}, "missing choices in response"),
        ({"status": 200, "body": '{"choices": [{"message": {}}]}'}, "empty response content"),
        ("   ", "empty response content"),
    ],
)
async def test_bad_llm_answers_are_failure_results(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, reply: Any, error: str
) -> None:
    """429/5xx, malformed JSON, no choices, blank content: the spec's texts, a
    multi-agent error update and a failed result, never -32603 or a traceback."""
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    await script(http, llm_url, "plan", reply)
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-bad", llm_url)), 20
    )
    assert "error" not in events[-1], events[-1]
    result = events[-1]["result"]
    assert result["success"] is False and result["mode"] == "multi-agent"
    assert result["error"].startswith(error), result
    last = updates(events)[-1]
    assert last["type"] == "status" and last["error"] is True and "event" not in last
    assert last["message"] == result["error"]
    assert not any("Traceback" in line for line in bridge.logs)


async def test_an_answer_filtered_to_nothing_is_a_refused_run(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str
) -> None:
    """finish_reason content_filter and no content: the failed run's shape (an error
    update, success false) with ``stopReason: refusal``, and no further call."""
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    await script(http, llm_url, "plan", {"content": "", "finish_reason": "content_filter"})
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-filtered", llm_url)), 20
    )
    assert "error" not in events[-1], events[-1]
    result = events[-1]["result"]
    assert result["success"] is False and result["mode"] == "multi-agent"
    assert result["stopReason"] == "refusal"
    assert result["error"] == "empty response content (finish_reason content_filter)"
    last = updates(events)[-1]
    assert last["type"] == "status" and last["error"] is True
    assert last["message"] == result["error"]
    assert len(await seen(http, llm_url)) == 2  # planner, the filtered worker


CLIENT_KEY = "sk-client-very-secret-0123456789"


async def test_a_key_the_llm_echoes_is_redacted(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    """An LLM that quotes the caller's key (``Incorrect API key provided: sk-…``, or
    in an answer) put it into the error text: the failed result, the error update
    and the log line; and into step events and the result's plan/summary."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"max_iterations": 1}}, tmp=tmp_path
    )
    await script(
        http,
        llm_url,
        f"plan using {CLIENT_KEY}",
        f"draft {CLIENT_KEY}",
        f"SCORE: 9/10 (key {CLIENT_KEY})",
    )
    p = params("ma-k1", llm_url, aiGatewayApiKey=CLIENT_KEY)
    ok = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", p), 20)
    assert ok[-1]["result"]["success"] is True
    assert ok[-1]["result"]["summary"] == "draft [REDACTED]"
    await script(
        http,
        llm_url,
        "plan",
        {"status": 401, "body": f'{{"error": "Incorrect API key provided: {CLIENT_KEY}"}}'},
    )
    p = params("ma-k2", llm_url, aiGatewayApiKey=CLIENT_KEY)
    failed = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", p), 20)
    result = failed[-1]["result"]
    assert result["error"] == 'api error 401: {"error": "Incorrect API key provided: [REDACTED]"}'
    for events in (ok, failed):
        assert CLIENT_KEY not in orjson.dumps(events).decode()
    assert any("multi-agent turn failed" in line for line in bridge.logs)
    assert not any(CLIENT_KEY in line for line in bridge.logs)


async def test_no_client_url_means_the_default_under_the_host_policy(
    start_bridge: StartBridge, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A client key without ``aiGatewayBaseUrl`` skipped the host check and went to
    the default ``https://api.openai.com/v1``, past a list naming only other hosts:
    the default URL is now checked like any other."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV),
        config={"multi_agent": {"allowed_hosts": ["127.0.0.1"], "call_timeout": 3}},
        tmp=tmp_path,
    )
    p = params("ma-d", "")
    del p["aiGatewayBaseUrl"]
    events = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", p), 20)
    result = events[-1]["result"]
    assert result["success"] is False and result["error"] == HOST_REFUSED, result


@pytest.mark.parametrize(
    ("workers", "replies", "calls", "steps_before"),
    [
        # both parallel workers hang: the TaskGroup is torn down
        (
            2,
            ["plan", {"content": "a", "delay_ms": 30000}, {"content": "b", "delay_ms": 30000}],
            3,
            2,
        ),
        # the reviewer's call hangs
        (1, ["plan", "draft", {"content": "SCORE: 9/10", "delay_ms": 30000}], 3, 3),
        # the planner's call hangs
        (1, [{"content": "plan", "delay_ms": 30000}], 1, 1),
    ],
)
async def test_cancel_aborts_any_call_in_flight(
    start_bridge: StartBridge,
    http: aiohttp.ClientSession,
    llm_url: str,
    tmp_path: Path,
    workers: int,
    replies: list[Any],
    calls: int,
    steps_before: int,
) -> None:
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"workers": workers}}, tmp=tmp_path
    )
    await script(http, llm_url, *replies)
    task = asyncio.create_task(sse(http, bridge.rpc_url, "session.start", params("ma-c", llm_url)))

    async def hanging() -> bool:
        return len(await seen(http, llm_url)) >= calls

    await eventually(hanging)
    reply = await rpc(http, bridge.rpc_url, "session.cancel", {"sessionId": "ma-c"}, rid=9)
    assert reply["result"] == {"accepted": True, "cancelled": True}
    events = await asyncio.wait_for(task, 5)
    assert len(steps(events)) == steps_before
    result = events[-1]["result"]
    assert result["success"] is False and result["cancelled"] is True
    assert result["error"] == "turn cancelled"


async def test_the_rework_prompt_does_not_grow_across_iterations(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    """Each rework gets the task, the plan, the last draft and the last review only:
    earlier rounds are not carried along, so the prompt stays bounded."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"max_iterations": 3}}, tmp=tmp_path
    )
    await script(
        http,
        llm_url,
        "plan",
        "d1",
        "review-1 SCORE: 1/10",
        "d2",
        "review-2 SCORE: 2/10",
        "d3",
        "review-3 SCORE: 3/10",
    )
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-g", llm_url)), 20
    )
    result = events[-1]["result"]
    assert result["iterations"] == 3 and result["summary"] == "d3" and result["finalScore"] == 3
    assert [(s[0], s[2]) for s in steps(events)][2:] == [
        ("Worker", 1),
        ("Reviewer", 1),
        ("Worker", 2),
        ("Reviewer", 2),
        ("Worker", 3),
        ("Reviewer", 3),
    ]
    requests = await seen(http, llm_url)
    assert len(requests) == 7  # 1 planner + 3 × (worker + reviewer): the bound
    third_worker = requests[5]["body"]["messages"][1]["content"]
    assert "d2" in third_worker and "review-2" in third_worker
    assert "d1" not in third_worker and "review-1" not in third_worker


async def test_an_oversized_answer_is_a_failure_result(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str
) -> None:
    bridge = await start_bridge(env=base_env(**TOKEN_ENV))
    huge = {"status": 200, "body": "x" * (16 * 1024 * 1024 + 1)}
    await script(http, llm_url, huge)
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-big", llm_url)), 30
    )
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "response larger than 16777216 bytes"


async def test_a_failed_parallel_round_leaves_later_cancels_working(
    start_bridge: StartBridge, http: aiohttp.ClientSession, llm_url: str, tmp_path: Path
) -> None:
    """After a round where one worker failed and the group cancelled the other, the
    thread still serves turns: the next one's session.cancel ends it cancelled and
    the one after succeeds (the group's own cancels leave no trace on the task)."""
    bridge = await start_bridge(
        env=base_env(**TOKEN_ENV), config={"multi_agent": {"workers": 2}}, tmp=tmp_path
    )
    slow = {"content": "late", "delay_ms": 30000}
    await script(http, llm_url, "plan", {"status": 500, "body": "boom"}, slow)
    first = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params("ma-s", llm_url)), 20
    )
    assert first[-1]["result"]["error"] == "api error 500: boom"
    await http.post(f"{llm_url}/_reset")
    await script(http, llm_url, {"content": "plan", "delay_ms": 30000})
    task = asyncio.create_task(
        sse(http, bridge.rpc_url, "session.message", params("ma-s", llm_url))
    )

    async def planner_called() -> bool:
        return len(await seen(http, llm_url)) >= 1

    await eventually(planner_called)
    reply = await rpc(http, bridge.rpc_url, "session.cancel", {"sessionId": "ma-s"}, rid=9)
    assert reply["result"] == {"accepted": True, "cancelled": True}
    events = await asyncio.wait_for(task, 5)
    assert events[-1]["result"]["cancelled"] is True
    await script(http, llm_url, "plan", "d", "d", "SCORE: 9/10")
    again = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.message", params("ma-s", llm_url)), 20
    )
    assert again[-1]["result"]["success"] is True
