"""Single-agent turns end to end: result assembly, forwarded request, routing to providers,
seq numbering, and the explicit targets whose backend this build does not ship.

Spec: forwarding.md §1-§5, contract.md §11-§13, examples.md §3-§6, §9, §10.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import (
    EXPLICIT,
    TOKEN,
    FakeUpstream,
    MakeUpstream,
    ServeApp,
    StartBridge,
    base_env,
    provider_env,
    providers_config,
    rpc,
    scripted_app,
    session_params,
    sse,
    updates,
)

ROUTING_FIELDS_OPENCODE = {
    "resolvedExecutionTarget": "single-agent",
    "resolvedProviderId": "opencode",
    "resolvedGatewayProviderId": "",
    "resolvedModel": "",
    "resolvedSkills": None,
    "skillResolutionSource": "none",
    "needsSkillInstall": False,
    "unavailable": False,
}
STARTED = {
    "type": "status",
    "event": "started",
    "message": "session started",
    "pending": True,
    "error": False,
}


def lower_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def routing(provider: str | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(EXPLICIT)
    if provider is not None:
        out["explicitProviderId"] = provider
    out.update(extra)
    return out


def echo_reply(result: dict[str, Any]) -> Any:
    """Upstream reply: a JSON-RPC success envelope echoing the request id."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": body["id"], "result": result}

    return reply


# --- result assembly (forwarding.md §4.7, §5; examples.md §3) -----------------------------


async def test_examples_3_result_and_forwarded_request(
    start_bridge: StartBridge,
    serve_app: ServeApp,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    seen: list[dict[str, Any]] = []
    upstream_result = {
        "success": True,
        "output": "pong",
        "turnId": "turn-upstream-1",
        "provider": "opencode",
        "mode": "single-agent",
    }
    base = await serve_app(scripted_app(echo_reply(upstream_result), seen))
    demo = tmp_path / "demo"
    demo.mkdir()
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        INTERNAL_SERVICE_TOKEN="svc-secret-token",
        XWM_PROVIDER_OPENCODE_URL=f"{base}/opencode/acp/rpc",
    )
    bridge = await start_bridge(env=env)
    client_routing = routing("opencode")
    params = {
        "sessionId": "session-1",
        "threadId": "thread-1",
        "taskPrompt": "Reply with exactly pong",
        "workingDirectory": str(demo),
        "routing": client_routing,
    }
    reply = await rpc(http, bridge.rpc_url, "session.start", params, rid="task-1")

    assert reply["id"] == "task-1"
    wd = str(demo)
    assert reply["result"] == {
        "success": True,
        "output": "pong",
        "summary": "pong",
        "resultSummary": "pong",
        "turnId": "turn-upstream-1",
        "provider": "opencode",
        "mode": "single-agent",
        "effectiveWorkingDirectory": wd,
        "remoteWorkingDirectory": wd,
        "remoteWorkspaceRefKind": "remotePath",
        "remoteExecution": {
            "remoteWorkingDirectory": wd,
            "remoteWorkspaceRefKind": "remotePath",
            "provider": "opencode",
            "turnId": "turn-upstream-1",
        },
        "artifacts": [],
        **ROUTING_FIELDS_OPENCODE,
    }

    assert len(seen) == 1
    sent = seen[0]
    assert sent["path"] == "/opencode/acp/rpc"
    body = sent["body"]
    assert body["jsonrpc"] == "2.0"
    assert isinstance(body["id"], str) and body["id"].startswith("req-")
    assert body["method"] == "session.start"
    assert body["params"] == {
        "sessionId": "session-1",
        "threadId": "thread-1",
        "taskPrompt": "Reply with exactly pong",
        "workingDirectory": wd,
        "routing": client_routing,
        "mode": "single-agent",
        "provider": "opencode",
    }
    headers = lower_headers(sent["headers"])
    assert headers["authorization"] == "Bearer svc-secret-token"
    assert headers["content-type"].startswith("application/json")
    # a plain-JSON client cannot receive notifications: the upstream is asked for JSON,
    # exactly as the original asks (forwarding.md §4.4)
    assert headers["accept"] == "application/json"


async def test_defaults_filled_when_upstream_omits_them(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    seen: list[dict[str, Any]] = []
    base = await serve_app(scripted_app(echo_reply({"success": True, "message": "done"}), seen))
    bridge = await start_bridge(env=provider_env(base))
    params = {"sessionId": "s-def", "taskPrompt": "x", "routing": routing("codex")}
    events = await sse(http, bridge.rpc_url, "session.start", params, rid=7)

    [started] = updates(events)
    result = events[-1]["result"]
    bridge_turn = started["turnId"]
    assert bridge_turn.startswith("turn-") and bridge_turn[5:].isdigit()
    assert result["success"] is True
    assert result["output"] == result["summary"] == result["resultSummary"] == "done"
    assert result["message"] == "done"
    assert result["provider"] == "codex"
    assert result["mode"] == "single-agent"
    assert result["turnId"] == bridge_turn
    assert "effectiveWorkingDirectory" not in result  # no workingDirectory → not set
    assert result["remoteWorkingDirectory"] == ""
    assert result["remoteWorkspaceRefKind"] == "remotePath"
    assert result["remoteExecution"] == {
        "remoteWorkingDirectory": "",
        "remoteWorkspaceRefKind": "remotePath",
        "provider": "codex",
        "turnId": bridge_turn,
    }
    assert result["artifacts"] == []
    assert result["resolvedProviderId"] == "codex"
    assert seen[0]["body"]["method"] == "session.start"


async def test_upstream_fields_preserved_and_precedence(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    upstream_result = {
        "success": True,
        "output": "the output",
        "summary": "the summary",
        "resultSummary": "the result summary",
        "resolvedWorkingDirectory": "/upstream/wd",
        "remoteExecution": {"remoteWorkspaceRefKind": "gitRef", "extra": 1},
        "sessionId": "upstream-session",
        "upstreamMethod": "session/prompt",
        "resolvedProviderId": "bogus",  # routing fields overwrite same-named keys
        "effectiveWorkingDirectory": "/upstream/effective",
    }
    base = await serve_app(scripted_app(echo_reply(upstream_result), []))
    bridge = await start_bridge(env=provider_env(base))
    params = session_params("s-prec", "x", workingDirectory="/client/wd")
    result = (await rpc(http, bridge.rpc_url, "session.message", params))["result"]

    assert result["output"] == "the output"
    assert result["summary"] == "the summary"
    assert result["resultSummary"] == "the result summary"
    assert result["sessionId"] == "upstream-session"
    assert result["upstreamMethod"] == "session/prompt"
    assert result["resolvedWorkingDirectory"] == "/upstream/wd"
    assert result["effectiveWorkingDirectory"] == "/upstream/effective"
    # first non-blank of R.remoteWorkingDirectory, R.remoteExecution.*, R.resolvedWorkingDirectory…
    assert result["remoteWorkingDirectory"] == "/upstream/wd"
    assert result["remoteWorkspaceRefKind"] == "gitRef"
    assert result["remoteExecution"] == {
        "remoteWorkingDirectory": "/upstream/wd",
        "remoteWorkspaceRefKind": "gitRef",
        "provider": "codex",
        "turnId": result["turnId"],
    }
    assert result["resolvedProviderId"] == "codex"
    assert result["provider"] == "codex"


async def test_collector_builds_output_from_streamed_notifications(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    """An SSE upstream whose result has no text: output = the deltas trimmed and joined
    with "\\n" as the original does (issue 15 item 4); turnId and
    resolvedWorkingDirectory come from the notifications."""
    from aiohttp import web

    def note(**params: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "session.update", "params": params}

    def reply(body: dict[str, Any]) -> web.Response:
        import orjson

        frames = [
            note(turnId="turn-up-9", delta="Hel", resolvedWorkingDirectory="/up/dir"),
            note(turnId="turn-up-9", delta="lo "),
            note(turnId="turn-up-9", delta="world"),
            note(turnId="turn-up-9", message="session started"),
            {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True}},
        ]
        raw = b"".join(b"data: " + orjson.dumps(f) + b"\n\n" for f in frames)
        return web.Response(body=raw, content_type="text/event-stream")

    base = await serve_app(scripted_app(reply, []))
    bridge = await start_bridge(env=provider_env(base))
    events = await sse(http, bridge.rpc_url, "session.start", session_params("s-col", "x"))
    relayed = [e for e in events if isinstance(e, dict) and e.get("method") == "session.update"]
    assert [e["params"].get("delta") for e in relayed[1:]] == ["Hel", "lo ", "world", None]
    result = events[-1]["result"]
    assert result["output"] == "Hel\nlo\nworld"
    assert result["summary"] == "Hel\nlo\nworld"
    assert result["resultSummary"] == "Hel\nlo\nworld"
    assert result["turnId"] == "turn-up-9"
    assert result["resolvedWorkingDirectory"] == "/up/dir"
    assert result["remoteWorkingDirectory"] == "/up/dir"


async def test_collector_uses_object_message_content(
    start_bridge: StartBridge, serve_app: ServeApp, http: aiohttp.ClientSession
) -> None:
    from aiohttp import web

    def reply(body: dict[str, Any]) -> web.Response:
        import orjson

        frames = [
            {
                "jsonrpc": "2.0",
                "method": "acp.session.update",
                "params": {"message": {"role": "assistant", "content": "from content"}},
            },
            {"jsonrpc": "2.0", "id": body["id"], "result": {"success": True}},
        ]
        raw = b"".join(b"data: " + orjson.dumps(f) + b"\n\n" for f in frames)
        return web.Response(body=raw, content_type="text/event-stream")

    base = await serve_app(scripted_app(reply, []))
    bridge = await start_bridge(env=provider_env(base))
    reply_ = await rpc(http, bridge.rpc_url, "session.start", session_params("s-msg", "x"))
    assert reply_["result"]["output"] == "from content"


async def test_forwarded_params_are_sanitized(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    client_routing = routing("opencode")
    params = {
        "sessionId": "s-san",
        "threadId": "t-san",
        "taskPrompt": "hi",
        "workingDirectory": "/nowhere/ws",
        "routing": client_routing,
        "metadata": {"trace": "x"},
        "executionTarget": "singleAgent",
        "agentId": "agent-7",
        "bridgeAuthorizationHeader": "Bearer leaked",
        "resolvedExecutionTarget": "gateway",
        "resolvedProviderId": "bogus",
        "resolvedGatewayProviderId": "openclaw",
        "resolvedModel": "m",
        "resolvedSkills": ["x"],
        "provider": "gemini",  # overwritten by the resolved provider
        "mode": "multi-agent",  # overwritten by the resolved mode
        "model": "model-9",
        "attachments": [{"name": "a", "path": "/p"}],
        "remoteWorkingDirectoryHint": "/hint",
        "customUnknown": {"nested": [1, 2]},
    }
    reply = await rpc(http, bridge.rpc_url, "session.start", params)
    assert reply["result"]["success"] is True
    [request] = fake_upstream.state.requests
    assert request["method"] == "session.start"
    assert request["params"] == {
        "sessionId": "s-san",
        "threadId": "t-san",
        "taskPrompt": "hi",
        "workingDirectory": "/nowhere/ws",
        "routing": client_routing,
        "mode": "single-agent",
        "provider": "opencode",
        "model": "model-9",
        "attachments": [{"name": "a", "path": "/p"}],
        "remoteWorkingDirectoryHint": "/hint",
        "customUnknown": {"nested": [1, 2]},
    }
    # the inbound client bearer never goes upstream
    headers = lower_headers(request["headers"])
    assert TOKEN not in headers.get("authorization", "")

    await rpc(http, bridge.rpc_url, "session.message", {**params, "taskPrompt": "again"})
    assert fake_upstream.state.requests[-1]["method"] == "session.message"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"INTERNAL_SERVICE_TOKEN": "svc-1"}, "Bearer svc-1"),
        ({"BRIDGE_AUTH_TOKEN": "brg-2"}, "Bearer brg-2"),
        ({"INTERNAL_SERVICE_TOKEN": "svc-1", "BRIDGE_AUTH_TOKEN": "brg-2"}, "Bearer svc-1"),
        ({"INTERNAL_SERVICE_TOKEN": "Token abc-3"}, "Token abc-3"),
        ({}, None),
    ],
    ids=["internal", "bridge-fallback", "internal-wins", "verbatim-with-space", "none"],
)
async def test_outbound_authorization(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    env: dict[str, str],
    expected: str | None,
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url, **env))
    reply = await rpc(http, bridge.rpc_url, "session.start", session_params("s-auth"))
    assert reply["result"]["success"] is True
    headers = lower_headers(fake_upstream.state.requests[0]["headers"])
    assert headers.get("authorization") == expected
    assert headers["accept"] == "application/json"


# --- provider selection ------------------------------------------------------------------


async def test_explicit_provider_not_in_catalog_is_unavailable(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    params = {"sessionId": "session-x", "taskPrompt": "hello", "routing": routing("claude")}
    message = "explicit provider is unavailable: 'claude' (enabled: codex, opencode, gemini)"
    expected = {
        "success": False,
        "error": message,
        "unavailable": True,
        "unavailableCode": "PROVIDER_UNAVAILABLE",
        "unavailableMessage": message,
        "resolvedExecutionTarget": "single-agent",
        "resolvedProviderId": "",
        "resolvedGatewayProviderId": "",
        "resolvedModel": "",
        "resolvedSkills": None,
        "skillResolutionSource": "none",
        "needsSkillInstall": False,
    }
    reply = await rpc(http, bridge.rpc_url, "session.start", params, rid="task-3")
    assert reply == {"jsonrpc": "2.0", "id": "task-3", "result": expected}

    events = await sse(http, bridge.rpc_url, "session.start", params, rid="task-3b")
    assert events == [{"jsonrpc": "2.0", "id": "task-3b", "result": expected}]
    assert fake_upstream.state.requests == []

    # an unavailable session.message creates no session record
    msg = {**params, "sessionId": "session-y"}
    assert (await rpc(http, bridge.rpc_url, "session.message", msg))["result"] == expected
    closed = await rpc(http, bridge.rpc_url, "session.close", {"sessionId": "session-y"})
    assert closed["result"] == {"accepted": True, "closed": False}


async def test_each_provider_routed_to_its_own_endpoint(
    start_bridge: StartBridge, make_fake_upstream: MakeUpstream, http: aiohttp.ClientSession
) -> None:
    fakes = {pid: await make_fake_upstream() for pid in ("codex", "opencode", "gemini")}
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        **{f"XWM_PROVIDER_{pid.upper()}_URL": f.url for pid, f in fakes.items()},
    )
    bridge = await start_bridge(env=env)
    for pid in ("gemini", "codex", "opencode"):
        params = session_params(f"s-{pid}", f"to {pid}", routing=routing(pid))
        result = (await rpc(http, bridge.rpc_url, "session.start", params))["result"]
        assert result["success"] is True
        assert result["output"] == f"echo: to {pid}"
        assert result["resolvedProviderId"] == pid
        assert result["provider"] == "fake"  # the upstream's value wins over the default
    for pid, fake in fakes.items():
        [request] = fake.state.requests
        assert request["params"]["provider"] == pid
        assert request["params"]["sessionId"] == f"s-{pid}"


async def test_auto_routing_uses_first_available_provider(
    start_bridge: StartBridge, make_fake_upstream: MakeUpstream, http: aiohttp.ClientSession
) -> None:
    first, second = await make_fake_upstream(), await make_fake_upstream()
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        XWM_PROVIDER_CODEX_URL=first.url,
        XWM_PROVIDER_OPENCODE_URL=second.url,
        XWM_PROVIDER_GEMINI_URL=second.url,
    )
    bridge = await start_bridge(env=env)
    params = session_params("s-auto", "hello", routing={"routingMode": "auto"})
    result = (await rpc(http, bridge.rpc_url, "session.start", params))["result"]
    assert result["success"] is True
    assert result["resolvedProviderId"] == "codex"
    assert len(first.state.requests) == 1
    assert second.state.requests == []


async def test_yaml_catalog_custom_provider_and_disabled_provider(
    start_bridge: StartBridge,
    make_fake_upstream: MakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    claude, codex, gemini = [await make_fake_upstream() for _ in range(3)]
    config = providers_config(
        {"id": "claude", "label": "Claude Code", "endpoint": claude.url},
        {"id": "codex", "label": "Codex", "endpoint": codex.url},
        {"id": "opencode", "label": "OpenCode", "endpoint": codex.url, "enabled": False},
        {"id": "gemini", "endpoint": f"{gemini.url}/gemini/acp/rpc"},
    )
    bridge = await start_bridge(config=config, tmp=tmp_path)

    caps = (await rpc(http, bridge.rpc_url, "acp.capabilities"))["result"]
    catalog = [
        {"providerId": "claude", "label": "Claude Code"},
        {"providerId": "codex", "label": "Codex"},
        {"providerId": "gemini", "label": "gemini"},
    ]
    assert caps["providerCatalog"] == catalog
    assert caps["capabilities"]["providerCatalog"] == catalog
    assert caps["singleAgent"] is True
    assert caps["capabilities"]["single_agent"] is True

    # the disabled provider is unavailable for explicit routing and never contacted
    params = session_params("s-dis", "x", routing=routing("opencode"))
    result = (await rpc(http, bridge.rpc_url, "session.start", params))["result"]
    assert result["success"] is False
    assert result["unavailable"] is True
    assert result["unavailableMessage"].startswith("explicit provider is unavailable: 'opencode'")
    assert codex.state.requests == []

    # the custom provider is routable, explicitly and (as first in the catalog) automatically
    for rid, route in enumerate((routing("claude"), {"routingMode": "auto"})):
        params = session_params(f"s-claude-{rid}", "hi", routing=route)
        result = (await rpc(http, bridge.rpc_url, "session.start", params))["result"]
        assert result["success"] is True, result
        assert result["resolvedProviderId"] == "claude"
    assert [r["params"]["provider"] for r in claude.state.requests] == ["claude", "claude"]

    params = session_params("s-gem", "hi", routing=routing("gemini"))
    assert (await rpc(http, bridge.rpc_url, "session.start", params))["result"]["success"]
    assert len(gemini.state.requests) == 1


# --- streaming and seq (contract.md §12.4, §13) --------------------------------------------


async def test_sse_events_and_relayed_upstream_notifications(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    fake_upstream.state.chunks = 4
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    params = session_params("s-sse", "streamed words here", threadId="t-sse")
    events = await sse(http, bridge.rpc_url, "session.start", params, rid="r1")

    assert events[0] == {
        "jsonrpc": "2.0",
        "method": "session.update",
        "params": {"sessionId": "s-sse", "threadId": "t-sse", "seq": 1, **STARTED}
        | {"turnId": events[0]["params"]["turnId"]},
    }
    relayed = events[1:-1]
    assert len(relayed) == 4
    upstream_turn = relayed[0]["params"]["turnId"]
    assert upstream_turn.startswith("turn-fake-")
    for i, note in enumerate(relayed, 1):
        assert note["method"] == "session.update"
        # relayed verbatim: the upstream's own fields and seq, no bridge threadId
        assert set(note["params"]) == {"sessionId", "turnId", "seq", "type", "delta"}
        assert note["params"]["seq"] == i
        assert note["params"]["turnId"] == upstream_turn
    assert "".join(n["params"]["delta"] for n in relayed) == "echo: streamed words here"
    final = events[-1]
    assert final["id"] == "r1"
    assert final["result"]["output"] == "echo: streamed words here"
    assert final["result"]["turnId"] == upstream_turn  # upstream's turnId wins in the result
    assert events[0]["params"]["turnId"] != upstream_turn
    assert "[DONE]" not in events
    # a client that can receive notifications makes the bridge ask the upstream for SSE
    accept = {k.lower(): v for k, v in fake_upstream.state.requests[-1]["headers"].items()}
    assert accept["accept"] == "application/json, text/event-stream"

    # an id-less SSE request ends with the [DONE] sentinel instead of a result
    events = await sse(http, bridge.rpc_url, "session.message", params, rid=None)
    assert events[-1] == "[DONE]"
    assert updates(events)[0]["seq"] == 2  # relayed notifications did not consume seq


async def test_websocket_upstream_relays_and_returns_result(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        INTERNAL_SERVICE_TOKEN="ws-svc",
        XWM_PROVIDER_CODEX_URL=fake_upstream.ws_url,
    )
    bridge = await start_bridge(env=env)
    events = await sse(
        http, bridge.rpc_url, "session.start", session_params("s-ws", "over ws"), rid=3
    )
    [started] = updates(events)
    assert started["seq"] == 1
    relayed = [
        e for e in events[:-1] if isinstance(e, dict) and "threadId" not in e.get("params", {})
    ]
    assert len(relayed) == 3
    assert "".join(e["params"]["delta"] for e in relayed) == "echo: over ws"
    result = events[-1]["result"]
    assert result["success"] is True
    assert result["output"] == "echo: over ws"
    assert result["turnId"] == relayed[0]["params"]["turnId"]
    [request] = fake_upstream.state.requests
    assert request["transport"] == "ws"
    assert request["method"] == "session.start"
    assert lower_headers(request["headers"])["authorization"] == "Bearer ws-svc"

    # plain JSON over the same WebSocket upstream still assembles the result
    reply = await rpc(http, bridge.rpc_url, "session.message", session_params("s-ws", "again"))
    assert reply["result"]["output"] == "echo: again"


async def test_seq_numbering_across_turns(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    params = session_params("s-seq", "p", threadId="t-seq")

    async def started_seq(method: str) -> dict[str, Any]:
        events = await sse(http, url, method, params)
        [update] = updates(events)
        assert events[-1]["result"]["success"] is True
        return update

    seen = [await started_seq(m) for m in ("session.start", "session.message", "session.message")]
    assert [u["seq"] for u in seen] == [1, 2, 3]
    assert len({u["turnId"] for u in seen}) == 3
    assert all(u["threadId"] == "t-seq" and u["sessionId"] == "s-seq" for u in seen)
    assert (await started_seq("session.start"))["seq"] == 1  # start resets the session
    assert (await started_seq("session.message"))["seq"] == 2

    # close forgets the session; the next message silently starts a fresh one
    closed = await rpc(http, url, "session.close", {"sessionId": "s-seq"}, rid="c2")
    assert closed == {"jsonrpc": "2.0", "id": "c2", "result": {"accepted": True, "closed": True}}
    assert (await started_seq("session.message"))["seq"] == 1
    assert (await started_seq("session.message"))["seq"] == 2
    closed = await rpc(http, url, "session.close", {"sessionId": "never-seen"})
    assert closed["result"] == {"accepted": True, "closed": False}


async def test_session_errors(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    url = bridge.rpc_url
    reply = await rpc(http, url, "session.start", {"taskPrompt": "hi"}, rid="e1")
    assert reply == {
        "jsonrpc": "2.0",
        "id": "e1",
        "error": {"code": -32602, "message": "sessionId is required"},
    }
    for method in ("session.message", "session.cancel", "session.close"):
        reply = await rpc(http, url, method, {"sessionId": "   "})
        assert reply["error"] == {"code": -32602, "message": "sessionId is required"}
    for bad_routing in (None, {}, "explicit"):
        params: dict[str, Any] = {"sessionId": "s1", "taskPrompt": "hi"}
        if bad_routing is not None:
            params["routing"] = bad_routing
        reply = await rpc(http, url, "session.message", params, rid="e2")
        assert reply == {
            "jsonrpc": "2.0",
            "id": "e2",
            "error": {"code": -32602, "message": "ROUTING_REQUIRED"},
        }
    # ROUTING_REQUIRED emits nothing and creates no session record
    events = await sse(http, url, "session.message", {"sessionId": "s1", "taskPrompt": "hi"})
    assert events == [
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "ROUTING_REQUIRED"}}
    ]
    closed = await rpc(http, url, "session.close", {"sessionId": "s1"})
    assert closed["result"]["closed"] is False
    assert fake_upstream.state.requests == []


# --- targets without a backend in this build ---------------------------------------------


@pytest.mark.parametrize("gateway", ["openclaw", None])
async def test_explicit_gateway_target_not_connected(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    gateway: str | None,
) -> None:
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    route: dict[str, Any] = {"routingMode": "explicit", "explicitExecutionTarget": "gateway"}
    if gateway:
        route["preferredGatewayProviderId"] = gateway
    params = {"sessionId": "session-g", "taskPrompt": "search the web", "routing": route}
    events = await asyncio.wait_for(
        sse(http, bridge.rpc_url, "session.start", params, rid="task-5"), 10
    )
    started, failed = updates(events)
    assert {k: started[k] for k in STARTED} == STARTED
    assert started["seq"] == 1
    assert failed == {
        "sessionId": "session-g",
        "threadId": "session-g",
        "turnId": started["turnId"],
        "seq": 2,
        "type": "status",
        "event": "completed",
        "message": "gateway not connected",
        "pending": False,
        "error": True,
    }
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == "gateway not connected"
    assert result["mode"] == "gateway-chat"
    assert result["turnId"] == started["turnId"]
    assert result["resolvedExecutionTarget"] == "gateway"
    assert result["resolvedGatewayProviderId"] == (gateway or "local")
    assert result["resolvedProviderId"] == ""
    assert result["unavailable"] is False
    assert fake_upstream.state.requests == []


async def test_explicit_multi_agent_target_without_key(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, http: aiohttp.ClientSession
) -> None:
    """forwarding.md §6.4-5: planner step, then the missing-key error; nothing forwarded."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    route = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}
    params = {"sessionId": "session-m", "taskPrompt": "plan it", "routing": route}
    events = await asyncio.wait_for(sse(http, bridge.rpc_url, "session.start", params), 10)
    started, planner, failed = updates(events)
    assert started["event"] == "started" and started["seq"] == 1
    assert planner["type"] == "step" and planner["role"] == "architect"
    assert planner["message"] == "Preparing multi-agent run"
    message = "aiGatewayApiKey is required for multi-agent mode"
    assert failed == {
        "sessionId": "session-m",
        "threadId": "session-m",
        "turnId": started["turnId"],
        "seq": 3,
        "type": "status",
        "mode": "multi-agent",
        "message": message,
        "pending": False,
        "error": True,
    }
    result = events[-1]["result"]
    assert result["success"] is False
    assert result["error"] == message
    assert result["mode"] == "multi-agent"
    assert result["turnId"] == started["turnId"]
    assert result["resolvedExecutionTarget"] == "multi-agent"
    caps = (await rpc(http, bridge.rpc_url, "acp.capabilities"))["result"]
    assert caps["multiAgent"] is True
    assert fake_upstream.state.requests == []


@pytest.mark.parametrize("prompt", ["", "   ", None])
async def test_empty_task_prompt_is_refused_before_the_queue(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    prompt: str | None,
) -> None:
    """Issue 15 item 5: a blank taskPrompt is -32602, never forwarded to the agent."""
    bridge = await start_bridge(env=provider_env(fake_upstream.url))
    params = session_params("s-empty", "x")
    if prompt is None:
        del params["taskPrompt"]
    else:
        params["taskPrompt"] = prompt
    for method in ("session.start", "session.message"):
        reply = await rpc(http, bridge.rpc_url, method, params)
        assert reply["error"] == {"code": -32602, "message": "taskPrompt is required"}, reply
    assert fake_upstream.state.requests == []
