"""The ACP front door against the protocol's rules (agentclientprotocol.com, schema v1):
version negotiation, the methods of the schema the bridge does not serve, stop reasons,
the advertised prompt capabilities. The in-process daemon's ``/acp/remote``: raw frames
where the SDK's models would not send them, else the official SDK's WebSocket client;
every frame of the SDK's connections is schema-checked (``FrameChecker``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from acp import schema, text_block
from acp.meta import AGENT_METHODS

from internal.peers.fake_llm import STATE_KEY
from internal.peers.fake_llm import create_app as llm_app
from tests.acp_schema import check_error, strict
from tests.conftest import AUTH, FakeUpstream, ServeApp, StartBridge, wait_until
from tests.integration.acp_helpers import prompt
from tests.integration.test_acp_remote import config, sdk_client

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

#: the methods of ACP v1's schema the bridge serves (the rest are -32601)
SERVED = {
    "initialize",
    "authenticate",
    "session/new",
    "session/load",
    "session/resume",
    "session/list",
    "session/close",
    "session/prompt",
    "session/cancel",
    "session/set_mode",
    "session/set_config_option",
}
HI = {"type": "text", "text": "hi"}
AUDIO = {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"}
IMAGE = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}


async def send(ws: aiohttp.ClientWebSocketResponse, frame: dict[str, Any]) -> None:
    await ws.send_str(orjson.dumps({"jsonrpc": "2.0", **frame}).decode())


async def ask(ws: aiohttp.ClientWebSocketResponse, rid: Any, method: str, params: Any) -> Any:
    """Send one request; the next frame must be its answer (nothing else comes first)."""
    await send(ws, {"id": rid, "method": method, "params": params})
    msg = await asyncio.wait_for(ws.receive(), 20)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    frame = orjson.loads(msg.data)
    assert frame.get("id") == rid and "method" not in frame, frame
    return frame


def ws_url(bp: Any) -> str:
    return f"{bp.url}/acp/remote".replace("http", "ws")


async def test_protocol_version_negotiation(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # ACP: the agent answers the requested version when it supports it, else the latest
    # it supports (the client then disconnects if it cannot speak that one). A legacy
    # string version (clients of the MCP-style date era, e.g. older Zed builds) is
    # version 0 to the Rust SDK and parsed or taken as 1 by the Python SDK: never refused.
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        for rid, version in enumerate((1, 0, 2, 65535, "2024-11-05", "1"), 1):
            answer = await ask(ws, rid, "initialize", {"protocolVersion": version})
            assert "error" not in answer, (version, answer)
            strict(schema.InitializeResponse, answer["result"])
            assert answer["result"]["protocolVersion"] == 1, version
        # protocolVersion is required (a uint16, or a legacy string): anything else is
        # invalid params
        for rid, params in enumerate(
            ({}, {"protocolVersion": None}, {"protocolVersion": -1}, {"protocolVersion": [1]}),
            10,
        ):
            answer = await ask(ws, rid, "initialize", params)
            check_error(answer["error"])
            assert answer["error"]["code"] == -32602 and "protocolVersion" in str(answer), params


async def test_schema_methods_the_bridge_does_not_serve_are_method_not_found(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # every agent method of the schema the bridge does not implement (the unstable
    # session/fork, session/delete, logout, providers/*, nes/*, document/*…) is -32601
    # "Method not found", never -32602/-32603; as a notification it is not answered
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    # an extension method ("_"-prefixed) the bridge does not know is the same (ACP
    # extensibility: "Method not found")
    others = [*sorted(set(AGENT_METHODS.values()) - SERVED), "_xwm/unknown"]
    assert {"session/fork", "session/delete", "logout"} <= set(others)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        await ask(ws, 0, "initialize", {"protocolVersion": 1})
        new = await ask(ws, "new", "session/new", {"cwd": str(tmp_path), "mcpServers": []})
        sid = new["result"]["sessionId"]
        params = {"sessionId": sid, "cwd": str(tmp_path), "mcpServers": []}
        for rid, method in enumerate(others, 1):
            answer = await ask(ws, rid, method, params)
            check_error(answer["error"])
            assert answer["error"]["code"] == -32601, (method, answer)
        for method in others:  # as notifications: dropped, never answered
            await send(ws, {"method": method, "params": params})
        # session/cancel of a session nobody has: a notification, so no answer, no error
        await send(ws, {"method": "session/cancel", "params": {"sessionId": "acp-nobody"}})
        await send(ws, {"method": "session/cancel", "params": {}})
        # the next frame out answers the request behind them
        listed = await ask(ws, "after", "session/list", {})
        strict(schema.ListSessionsResponse, listed["result"])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


async def test_errors_of_served_methods(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(bp), headers=AUTH) as ws:
        init = await ask(ws, 0, "initialize", {"protocolVersion": 1})
        offered = init["result"]["agentCapabilities"]["promptCapabilities"]
        assert offered == {"image": False, "audio": False, "embeddedContext": True}
        sid = (await ask(ws, 1, "session/new", {"cwd": str(tmp_path), "mcpServers": []}))["result"][
            "sessionId"
        ]
        reopen = {"cwd": str(tmp_path), "mcpServers": [], "sessionId": "acp-unknown"}
        for rid, method, params, code in (
            (2, "authenticate", {"methodId": "oauth"}, -32602),
            (3, "session/set_mode", {"sessionId": sid, "modeId": "no-such-mode"}, -32602),
            (4, "session/load", reopen, -32002),  # ACP's "resource not found"
            (5, "session/resume", reopen, -32002),
            (6, "session/close", {"sessionId": "acp-unknown"}, -32002),
            # every session method: an unknown session (or one not open on this
            # connection) is "resource not found", not invalid params
            (9, "session/prompt", {"sessionId": "acp-unknown", "prompt": [HI]}, -32002),
            (10, "session/set_mode", {"sessionId": "acp-unknown", "modeId": "auto"}, -32002),
            (
                11,
                "session/set_config_option",
                {"sessionId": "acp-unknown", "configId": "route", "value": "auto"},
                -32002,
            ),
            # promptCapabilities.audio: false (and image: false, no agent takes images)
            (7, "session/prompt", {"sessionId": sid, "prompt": [AUDIO, HI]}, -32602),
            (8, "session/prompt", {"sessionId": sid, "prompt": [IMAGE, HI]}, -32602),
        ):
            answer = await ask(ws, rid, method, params)
            check_error(answer["error"])
            assert answer["error"]["code"] == code, (method, answer)
    assert not [r for r in fake_upstream.state.requests if r["method"] == "session.message"]


@pytest.mark.parametrize("reason", ["end_turn", "max_tokens", "max_turn_requests", "refusal"])
async def test_an_agent_s_stop_reason_is_the_prompt_s(
    reason: str, start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # a stdio agent's stopReason reaches the ACP client as the agent gave it (a refusal
    # is an answer, not an error: the client drops the prompt from its history)
    cfg = config(fake_upstream, tmp_path)
    cfg["acp"] = {"default_route": "single-agent:fake"}
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await conn.prompt(session_id=session.session_id, prompt=prompt(f"stop {reason}"))
        assert answer.stop_reason == reason
        assert checker.text() == "stopping"


APPROVE = "score: 9/10"

#: one "write" prompt on the multi-agent route: its stop reason, the text the client
#: got, and what of the model's script was left unused
MultiAgentPrompt = Callable[[list[Any]], Awaitable[tuple[str, str, list[Any]]]]


@pytest.fixture
def prompt_multi_agent(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    serve_app: ServeApp,
    tmp_path: Path,
) -> MultiAgentPrompt:
    """The multi-agent route (2 rounds at most) on a fake model that answers ``script``
    in order (then echoes); the bridge gets one "write" prompt."""

    async def run(script: list[Any]) -> tuple[str, str, list[Any]]:
        app = llm_app()
        app[STATE_KEY].script.extend(script)
        llm = await serve_app(app)
        cfg = config(fake_upstream, tmp_path)
        cfg["acp"] = {"default_route": "multi-agent"}
        cfg["multi_agent"] = {"base_url": llm, "api_key": "sk-local", "max_iterations": 2}
        bp = await start_bridge(config=cfg, tmp=tmp_path)
        async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, checker):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            answer = await conn.prompt(session_id=session.session_id, prompt=prompt("write"))
            text = checker.text()
        return answer.stop_reason, text, list(app[STATE_KEY].script)

    return run


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ([], "max_turn_requests"),  # the echo has no score: never approved in 2 rounds
        (["plan", "draft", APPROVE], "end_turn"),
        (["plan", {"content": "dra", "finish_reason": "length"}, APPROVE], "max_tokens"),
        (["plan", {"content": "d", "finish_reason": "content_filter"}, APPROVE], "refusal"),
        # the answer is the best draft: the first round's, cut short
        (
            [
                "plan",
                {"content": "dra", "finish_reason": "length"},
                "score: 5/10",
                "draft",
                "score: 2/10",
            ],
            "max_tokens",
        ),
    ],
)
async def test_a_multi_agent_run_s_stop_reason(
    script: list[Any], reason: str, prompt_multi_agent: MultiAgentPrompt
) -> None:
    # max_iterations rounds without the reviewer's approval: max_turn_requests; a worker's
    # answer the model cut short (finish_reason length): max_tokens; filtered: refusal
    stop_reason, text, unused = await prompt_multi_agent(script)
    assert stop_reason == reason
    assert text  # the summary, as one message chunk
    assert not unused  # every scripted reply was used


async def test_a_multi_agent_answer_filtered_to_nothing_is_a_refusal(
    prompt_multi_agent: MultiAgentPrompt,
) -> None:
    # finish_reason content_filter with empty content: the run ends refused (no -32603)
    filtered = {"content": "", "finish_reason": "content_filter"}
    stop_reason, _, unused = await prompt_multi_agent(["plan", filtered])
    assert stop_reason == "refusal"
    assert not unused  # the run ended at the filtered answer


async def test_a_second_prompt_waits_for_the_first_and_one_cancel_ends_both(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # ACP v1 does not define two prompts of one session at once: the bridge runs them
    # one after the other (the session's thread queue); session/cancel ends every
    # prompt of the session, each answered cancelled
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, _):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        first = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("slow:20000 a")))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        second = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=prompt("b")))
        await conn.list_sessions()  # a round trip: the second prompt has been taken
        assert not second.done()
        await conn.cancel(session_id=sid)
        answers = await asyncio.wait_for(asyncio.gather(first, second), 15)
        assert [a.stop_reason for a in answers] == ["cancelled", "cancelled"]
        sent = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
        assert len(sent) == 1  # the queued one never reached the upstream
        answer = await conn.prompt(session_id=sid, prompt=prompt("after"))
        assert answer.stop_reason == "end_turn"


async def test_embedded_context_and_resource_links_reach_the_turn(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # promptCapabilities.embeddedContext: true (and resource_link, which every agent takes)
    bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
    async with sdk_client(f"{bp.url}/acp/remote", "ws") as (conn, _, checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        blocks = [
            text_block("review"),
            schema.EmbeddedResourceContentBlock(
                type="resource",
                resource=schema.TextResourceContents(
                    uri="file:///w/main.py", mime_type="text/x-python", text="print(1)"
                ),
            ),
            schema.ResourceContentBlock(
                type="resource_link", uri="file:///w/README.md", name="README.md"
            ),
        ]
        answer = await conn.prompt(session_id=session.session_id, prompt=blocks)
        assert answer.stop_reason == "end_turn"
        (sent,) = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
        assert sent["params"]["taskPrompt"] == (
            'review\n<resource uri="file:///w/main.py">\nprint(1)\n</resource>\n'
            "[README.md](file:///w/README.md)"
        )
        assert checker.text().startswith("echo: review")
