"""``xwm-bridge acp`` driven by the official ACP SDK's client, against the fake upstream
and the scripted stdio ACP agent; every frame the bridge sends is schema-checked."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from acp import RequestError, image_block, schema, text_block
from acp.schema import TextContentBlock

from internal.peers.fake_llm import create_app as llm_app
from tests.acp_schema import strict
from tests.conftest import ROOT, FakeUpstream, ServeApp, base_env, fresh_state_dir, wait_until
from tests.integration.acp_helpers import RecordingClient, caps, prompt, spawn_acp, write_config
from tests.integration.agent_helpers import agent_provider
from tests.nesting import nested_json

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


def config(upstream: FakeUpstream, tmp: Path, **extra: Any) -> dict[str, Any]:
    codex = {"id": "codex", "label": "Codex", "endpoint": upstream.url, **extra.pop("codex", {})}
    return {
        "providers": [codex, agent_provider()],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20},
        "acp": {"default_route": "single-agent:codex", **extra.pop("acp", {})},
        **extra,
    }


def gateway_config(upstream: FakeUpstream, tmp: Path, port: int) -> dict[str, Any]:
    """The ACP default route on the fake OpenClaw gateway listening on ``port``."""
    from internal.peers.fake_gateway import TOKEN as GW_TOKEN

    return config(
        upstream,
        tmp,
        acp={"default_route": "gateway:openclaw"},
        openclaw_url=f"ws://127.0.0.1:{port}",
        openclaw_token=GW_TOKEN,
    )


def kinds(updates: list[Any]) -> list[str]:
    return [u.session_update for u in updates]


async def test_streamed_turn_then_route_switched_to_a_stdio_agent(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with spawn_acp(tmp_path, config(fake_upstream, tmp_path)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        route = session.config_options[0]
        assert route.id == "route" and route.current_value == "single-agent:codex"
        assert "single-agent:fake" in [o.value for o in route.options]
        assert session.modes is not None and session.modes.current_mode_id == "single-agent:codex"

        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("hello there"))
        assert answer.stop_reason == "end_turn"
        chunks = acp.checker.updates("agent_message_chunk")
        assert len(chunks) == 3  # streamed, as the fake upstream sent them
        assert acp.checker.text() == "echo: hello there"
        (sent,) = [r for r in fake_upstream.state.requests if r["method"] == "session.message"]
        assert sent["params"]["sessionId"] == session.session_id
        assert sent["params"]["workingDirectory"] == str(tmp_path)
        assert sent["params"]["provider"] == "codex"

        # switch the route: the next prompt goes to the stdio agent
        options = await acp.conn.set_config_option(
            config_id="route", session_id=session.session_id, value="single-agent:fake"
        )
        assert options.config_options[0].current_value == "single-agent:fake"
        await wait_until(lambda: len(acp.checker.updates("config_option_update")) == 1)
        (mode,) = acp.checker.updates("current_mode_update")
        assert mode["currentModeId"] == "single-agent:fake"
        before = len(acp.checker.updates("agent_message_chunk"))
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("again"))
        assert answer.stop_reason == "end_turn"
        text = "".join(
            u["content"]["text"] for u in acp.checker.updates("agent_message_chunk")[before:]
        )
        # the agent starts a session of its own and is given the conversation so far
        assert text.startswith("agent says: again [context: [Context from the bridge")
        assert "1. hello there" in text
        assert acp.checker.updates("plan")[0]["entries"][0]["content"] == "answer"
        assert acp.checker.updates("usage_update") == [
            {"sessionUpdate": "usage_update", "used": 42, "size": 1000}
        ]
        assert (
            len([r for r in fake_upstream.state.requests if r["method"] == "session.message"]) == 1
        )

        # clients that cannot set options pass them in _meta; set_mode is the same switch
        other = await acp.conn.new_session(
            cwd=str(tmp_path), mcp_servers=[], **{"xwm-bridge/route": "single-agent:fake"}
        )
        assert other.config_options[0].current_value == "single-agent:fake"
        await acp.conn.set_session_mode(session_id=other.session_id, mode_id="single-agent:codex")
        answer = await acp.conn.prompt(session_id=other.session_id, prompt=prompt("via mode"))
        assert fake_upstream.state.requests[-1]["params"]["taskPrompt"] == "via mode"


async def test_cancel_mid_turn_reaches_the_upstream(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    async with spawn_acp(tmp_path, config(fake_upstream, tmp_path)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt("slow:20000 take time"))
        )
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        await acp.conn.cancel(session_id=session.session_id)
        answer = await asyncio.wait_for(turn, 15)
        assert answer.stop_reason == "cancelled"
        await wait_until(lambda: bool(fake_upstream.state.cancels), within=10)
        assert fake_upstream.state.cancels[0]["sessionId"] == session.session_id
        # the session goes on
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("after"))
        assert answer.stop_reason == "end_turn"

        # a cancel sent right behind the prompt (before the turn has started) still counts
        loop = asyncio.get_running_loop()
        started = loop.time()
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt("slow:4000 at once"))
        )
        await asyncio.sleep(0)
        await acp.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        assert loop.time() - started < 3.5  # the upstream's slow turn was cut short


async def test_cancel_of_a_stdio_agent_turn(fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt("slow"))
        )
        await wait_until(lambda: "working" in acp.checker.text(), within=20)
        await acp.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"


async def test_permission_round_trip_answered_by_the_client(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    target = tmp_path / "out.txt"
    async with spawn_acp(tmp_path, cfg) as acp:  # no fs capability: the bridge writes
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt(f"permission {target}")
        )
        assert answer.stop_reason == "end_turn"
        ((tool_call, options),) = acp.client.asked
        assert tool_call.kind == "edit" and tool_call.title == f"Write {target}"
        assert {o.kind for o in options} == {"allow_once", "allow_always", "reject_once"}
        assert "permission granted (once)" in acp.checker.text()
        assert target.read_text() == "written by fake agent\n"
        assert kinds(acp.client.updates).count("tool_call") == 1
        assert acp.checker.updates("tool_call_update")[-1]["status"] == "completed"

    # rejected by the client
    target.unlink()
    async with spawn_acp(tmp_path, cfg, client=RecordingClient(permission="reject_once")) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"permission {target}"))
        assert "permission denied" in acp.checker.text() and not target.exists()


async def test_a_tool_call_keeps_the_content_the_agent_gave_it(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # a stdio agent's tool_call may carry content (an edit's diff), rawOutput and _meta
    # (ACP's extension point: e.g. the agent's own tool name): the client gets them with
    # the tool call, as the agent sent them; and a tool_call_update's rawInput and _meta
    from internal.peers.fake_acp_prompts import TOOL_DONE_EXTRAS, tool_with_content

    path = str(tmp_path / "a.txt")
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt(f"toolcontent {path}")
        )
        assert answer.stop_reason == "end_turn"
        (tool,) = acp.checker.updates("tool_call")
        assert tool == {"sessionUpdate": "tool_call", **tool_with_content(path)}
        (done,) = acp.checker.updates("tool_call_update")
        assert done == {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "call-c",
            "status": "completed",
            **TOOL_DONE_EXTRAS,
        }


async def test_chunks_keep_the_meta_the_agent_gave_them(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # _meta on a stdio agent's message and thought chunks (on the update and on its text
    # block) reaches the ACP client as the agent sent it
    from internal.peers.fake_acp_prompts import META_CHUNKS

    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("metachunks"))
        assert answer.stop_reason == "end_turn"
        chunks = ("agent_thought_chunk", "agent_message_chunk")
        sent = [u for kind in chunks for u in acp.checker.updates(kind)]
        assert sent == META_CHUNKS


async def test_policy_rules_answer_without_asking(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    rules = [{"action": "reject", "kind": "edit"}]
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    cfg["agents"]["permission_rules"] = rules
    target = tmp_path / "never.txt"
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"permission {target}"))
        assert acp.client.asked == []
        assert "permission denied" in acp.checker.text() and not target.exists()


async def test_cancel_answers_a_pending_permission_request(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    client = RecordingClient(hold_permission=True)
    target = tmp_path / "held.txt"
    async with spawn_acp(tmp_path, cfg, client=client) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"permission {target}"))
        )
        await asyncio.wait_for(client.permission_asked.wait(), 20)
        await acp.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        assert not target.exists()


async def test_fs_requests_are_relayed_to_a_client_that_declared_fs(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    target = tmp_path / "buffer.txt"
    client = RecordingClient(files={str(tmp_path / "open.txt"): "unsaved editor text"})
    async with spawn_acp(tmp_path, cfg, client=client, capabilities=caps(fs=True)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"write {target} hello"))
        assert client.written == [(str(target), "hello")]
        assert not target.exists()  # the editor owns the buffer: the bridge wrote nothing
        assert "written" in acp.checker.text()
        await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt(f"read {tmp_path / 'open.txt'}")
        )
        assert "content: unsaved editor text" in acp.checker.text()
        await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt(f"read {tmp_path}/missing")
        )
        assert "read error -32002" in acp.checker.text()  # the client's own error, relayed
        fs_requests = [f for f in acp.checker.frames if str(f.get("method", "")).startswith("fs/")]
        assert [f["params"]["sessionId"] for f in fs_requests] == [session.session_id] * 3


async def test_terminals_are_relayed_to_a_client_that_declared_them(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    cfg["agents"]["terminal_enabled"] = True
    async with spawn_acp(tmp_path, cfg, capabilities=caps(terminal=True)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await acp.conn.prompt(session_id=session.session_id, prompt=prompt("terminal ls -la"))
        assert acp.client.terminals == [("editor-term-1", "ls", ["-la"])]
        assert "terminal output: editor ran ls -la" in acp.checker.text()
    # without the capability the bridge runs it (terminal_enabled), confined to the cwd
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt("terminal echo bridge-ran")
        )
        assert acp.client.terminals == []
        assert "terminal output: bridge-ran" in acp.checker.text()


async def test_cancel_answers_a_pending_relayed_fs_request(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    client = RecordingClient(hold_write=True)
    async with spawn_acp(tmp_path, cfg, client=client, capabilities=caps(fs=True)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"write {tmp_path}/x y"))
        )
        await asyncio.wait_for(client.write_asked.wait(), 20)
        await acp.conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
        # the agent got an answer for its request (an error), so it could stop
        assert "write error" in acp.checker.text()


async def test_sessions_listed_and_loaded_after_a_restart(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    state = Path(fresh_state_dir())
    work_a, work_b = tmp_path / "a", tmp_path / "b"
    work_a.mkdir()
    work_b.mkdir()
    cfg = config(fake_upstream, tmp_path, acp={"list_page_size": 1})
    async with spawn_acp(tmp_path, cfg, state_dir=state) as acp:
        first = await acp.conn.new_session(cwd=str(work_a), mcp_servers=[])
        await acp.conn.prompt(session_id=first.session_id, prompt=prompt("first question"))
        await acp.conn.set_config_option(
            config_id="route", session_id=first.session_id, value="single-agent:fake"
        )
        await acp.conn.prompt(session_id=first.session_id, prompt=prompt("to the agent"))
        second = await acp.conn.new_session(cwd=str(work_b), mcp_servers=[])
        await acp.conn.prompt(session_id=second.session_id, prompt=prompt("other project"))

    async with spawn_acp(tmp_path, cfg, state_dir=state) as acp:  # a new bridge process
        listed = await acp.conn.list_sessions(cwd=str(work_a))
        assert [s.session_id for s in listed.sessions] == [first.session_id]
        assert listed.sessions[0].title == "first question"
        assert listed.sessions[0].cwd == str(work_a) and listed.next_cursor is None
        page = await acp.conn.list_sessions()
        assert [s.session_id for s in page.sessions] == [second.session_id]  # newest first
        assert page.next_cursor is not None
        page = await acp.conn.list_sessions(cursor=page.next_cursor)
        assert [s.session_id for s in page.sessions] == [first.session_id]
        with pytest.raises(RequestError):
            await acp.conn.list_sessions(cursor="not-a-cursor")

        loaded = await acp.conn.load_session(
            cwd=str(work_a), session_id=first.session_id, mcp_servers=[]
        )
        assert loaded.config_options[0].current_value == "single-agent:fake"  # kept
        replay = [
            (u["sessionUpdate"], u.get("content", {}).get("text"))
            for u in acp.checker.updates()
            if u["sessionUpdate"] in ("user_message_chunk", "agent_message_chunk")
        ]
        said = "".join(t for k, t in replay if k == "agent_message_chunk")
        assert [t for k, t in replay if k == "user_message_chunk"] == [
            "first question",
            "to the agent",
        ]
        assert said.startswith("echo: first questionagent says: to the agent [context:")
        answer = await acp.conn.prompt(session_id=first.session_id, prompt=prompt("continued"))
        assert answer.stop_reason == "end_turn"
        # a restarted bridge's agent has a new session: it gets the conversation as context
        tail = acp.checker.text().rsplit("agent says: continued", 1)[1]
        assert tail.startswith(" [context: [Context from the bridge") and "2. to the agent" in tail

        # resume: no replay; close: the session is no longer open
        before = len(acp.checker.frames)
        await acp.conn.resume_session(cwd=str(work_b), session_id=second.session_id, mcp_servers=[])
        assert not [f for f in acp.checker.frames[before:] if f.get("method") == "session/update"]
        await acp.conn.prompt(session_id=second.session_id, prompt=prompt("resumed"))
        assert fake_upstream.state.requests[-1]["params"]["taskPrompt"] == "resumed"
        await acp.conn.close_session(session_id=second.session_id)
        with pytest.raises(RequestError) as err:
            await acp.conn.prompt(session_id=second.session_id, prompt=prompt("closed"))
        assert err.value.code == -32002
        with pytest.raises(RequestError) as err:
            await acp.conn.load_session(cwd=str(work_a), session_id="acp-nope", mcp_servers=[])
        assert err.value.code == -32002


async def test_load_replays_a_ledger_longer_than_one_replay_page(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # session/load read one store.replay page (the oldest replay_max_items entries):
    # the newest turns of a longer ledger were never replayed
    cfg = config(fake_upstream, tmp_path, store={"replay_max_items": 3})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        for text in ("one", "two", "three"):
            await acp.conn.prompt(session_id=session.session_id, prompt=prompt(text))
        live = "".join(
            u["content"]["text"]
            for u in acp.checker.updates()
            if u["sessionUpdate"] == "agent_message_chunk"
        )
        before = len(acp.checker.frames)
        await acp.conn.load_session(
            cwd=str(tmp_path), session_id=session.session_id, mcp_servers=[]
        )
        replay = [
            (u["params"]["update"]["sessionUpdate"], u["params"]["update"]["content"]["text"])
            for u in acp.checker.frames[before:]
            if u.get("method") == "session/update"
        ]
        assert [t for k, t in replay if k == "user_message_chunk"] == ["one", "two", "three"]
        assert "".join(t for k, t in replay if k == "agent_message_chunk") == live


async def test_a_final_only_provider_still_reaches_the_client(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, codex={"stream": False})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("quiet"))
        assert answer.stop_reason == "end_turn"
        assert acp.checker.updates("agent_message_chunk") == [
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "echo: quiet"},
            }
        ]
        # a failed turn is an error, not a stop reason
        with pytest.raises(RequestError) as err:
            await acp.conn.prompt(session_id=session.session_id, prompt=prompt("error now"))
        assert "fake upstream error" in str(err.value)


async def test_model_option_reaches_the_upstream(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, codex={"models": ["small", "large"]})
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        model = session.config_options[1]
        assert model.id == "model" and model.current_value == "default"
        await acp.conn.set_config_option(
            config_id="model", session_id=session.session_id, value="large"
        )
        await acp.conn.prompt(session_id=session.session_id, prompt=prompt("hi"))
        assert fake_upstream.state.requests[-1]["params"]["model"] == "large"
        with pytest.raises(RequestError):
            await acp.conn.set_config_option(
                config_id="model", session_id=session.session_id, value="huge"
            )


async def test_multi_agent_route(
    fake_upstream: FakeUpstream, tmp_path: Path, serve_app: ServeApp
) -> None:
    llm = await serve_app(llm_app())
    cfg = config(
        fake_upstream,
        tmp_path,
        acp={"default_route": "multi-agent"},
        multi_agent={"base_url": llm, "api_key": "sk-local", "max_iterations": 1},
    )
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await acp.conn.prompt(
            session_id=session.session_id, prompt=prompt("write a haiku")
        )
        # the fake's echo carries no score: one round, never approved
        assert answer.stop_reason == "max_turn_requests"
        thoughts = acp.checker.text("agent_thought_chunk")
        assert thoughts.startswith("Planner: ") and "Reviewer: " in thoughts
        assert acp.checker.text()  # the summary, as one message chunk
        assert len(acp.checker.updates("agent_message_chunk")) == 1


async def test_bad_input_gets_errors_and_eof_exits_cleanly(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    path = write_config(tmp_path, config(fake_upstream, tmp_path))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "acp",
        "--config",
        str(path),
        env=base_env(),
        cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def ask(line: bytes) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line + b"\n")
        await proc.stdin.drain()
        return dict(orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20)))

    truncated = await ask(b'{"jsonrpc":"2.0","id":1,"method":"initia')
    assert truncated["id"] is None and truncated["error"]["code"] == -32700
    init = await ask(
        b'{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":1}}'
    )
    assert init["result"]["protocolVersion"] == 1 and init["result"]["authMethods"] == []
    # ACP v1 takes JSON-RPC's "id": null on a request: it is answered, with that id
    null_id = await ask(
        b'{"jsonrpc":"2.0","id":null,"method":"initialize","params":{"protocolVersion":1}}'
    )
    assert null_id["id"] is None and "error" not in null_id, null_id
    strict(schema.InitializeResponse, null_id["result"])
    # a notification is never answered, not even one whose params are not an object or
    # nest too deep (the next frame out answers the request behind them)
    for note in (
        b'{"jsonrpc":"2.0","method":"session/cancel","params":["acp-x"]}',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":' + nested_json(300).encode() + b"}",
        b'{"jsonrpc":"2.0","method":"_xwm/nothing","params":{"_meta":{}}}',
    ):
        assert proc.stdin is not None
        proc.stdin.write(note + b"\n")
    unknown = await ask(b'{"jsonrpc":"2.0","id":"three","method":"session/fly","params":{}}')
    assert unknown["id"] == "three" and unknown["error"]["code"] == -32601
    early = await ask(
        b'{"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":"acp-x",'
        b'"prompt":[{"type":"text","text":"hi"}]}}'
    )
    assert early["id"] == 4 and early["error"]["code"] == -32002
    assert "session/new" in early["error"]["message"]
    bad = await ask(b'{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":"relative"}}')
    assert bad["error"]["code"] == -32602
    batch = await ask(b"[]")
    assert batch["error"]["code"] == -32600
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    stderr = (await proc.stderr.read()).decode() if proc.stderr else ""
    assert "Traceback" not in stderr
    assert (await proc.stdout.read()) == b""  # nothing but JSON-RPC ever reaches stdout
    _ = TextContentBlock  # the SDK type of the blocks above


IMAGE = image_block("iVBORw0KGgo=", "image/png")


def offers_images(acp: Any) -> bool:
    caps = acp.init.agent_capabilities
    return bool(caps and caps.prompt_capabilities and caps.prompt_capabilities.image)


@pytest.mark.parametrize("agent_caps", ["image", ""])
async def test_images_are_offered_once_a_stdio_agent_said_it_takes_them(
    agent_caps: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # promptCapabilities.image: only when a configured agent's own initialize said
    # image: true (learnt when it ran, kept in the state dir); only it gets the image
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    cfg["providers"][1]["env"] = [f"FAKE_AGENT_PROMPT_CAPS={agent_caps}"]
    state = tmp_path / "state"
    blocks = [text_block("describe"), IMAGE]
    async with spawn_acp(tmp_path, cfg, state_dir=state) as acp:
        assert not offers_images(acp)  # the agent has not run: not known to take images
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        with pytest.raises(RequestError) as err:
            await acp.conn.prompt(session_id=session.session_id, prompt=blocks)
        assert err.value.code == -32602 and "'image' is not accepted" in str(err.value)
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("hi"))
        assert answer.stop_reason == "end_turn"  # the agent ran: its initialize is learnt
    async with spawn_acp(tmp_path, cfg, state_dir=state) as acp:
        assert offers_images(acp) is (agent_caps == "image")
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        if agent_caps == "image":
            answer = await acp.conn.prompt(session_id=session.session_id, prompt=blocks)
            assert answer.stop_reason == "end_turn"
            assert acp.checker.text() == "text,image:image/png"
        else:
            with pytest.raises(RequestError) as err:
                await acp.conn.prompt(session_id=session.session_id, prompt=blocks)
            assert err.value.code == -32602


async def test_openclaw_gateway_route_connects_a_runtime_and_streams(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    from internal.peers.fake_gateway import FakeGateway, FakeGatewayState

    gw = FakeGateway(FakeGatewayState())
    await gw.start()
    try:
        cfg = gateway_config(fake_upstream, tmp_path, gw.port)
        async with spawn_acp(tmp_path, cfg) as acp:
            session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("tool: hi"))
            assert answer.stop_reason == "end_turn"  # OpenClaw's "stop"
            assert acp.checker.text() == "FAKE-GW says: tool: hi"
            (tool,) = acp.checker.updates("tool_call")
            assert tool["toolCallId"] == "t1" and tool["title"] == "read"
            turn = asyncio.ensure_future(
                acp.conn.prompt(session_id=session.session_id, prompt=prompt("slow:9000 a b c d e"))
            )
            await wait_until(lambda: acp.checker.text().endswith("FAKE-GW says:"), within=15)
            await acp.conn.cancel(session_id=session.session_id)
            assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
            assert gw.state.aborted  # chat.abort reached the gateway
    finally:
        await gw.stop()


@pytest.mark.parametrize("gateway", ["connects", "goes away"])
async def test_a_cancel_while_the_route_is_being_prepared_cancels_the_prompt(
    gateway: str, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # gateway:openclaw connects a runtime before the turn: a session/cancel sent meanwhile
    # still makes the prompt answer "cancelled", whether the connect then succeeds or
    # fails (ACP: the agent MUST answer a cancelled prompt with "cancelled")
    from internal.peers.fake_gateway import FakeGateway, FakeGatewayState

    hello = asyncio.Event()
    gw = FakeGateway(FakeGatewayState(hold_hello=hello))
    await gw.start()
    try:
        cfg = gateway_config(fake_upstream, tmp_path, gw.port)
        async with spawn_acp(tmp_path, cfg) as acp:
            session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            turn = asyncio.ensure_future(
                acp.conn.prompt(session_id=session.session_id, prompt=prompt("hi"))
            )
            await wait_until(lambda: gw.state.connects == 1, within=15)
            await acp.conn.cancel(session_id=session.session_id)
            await acp.conn.list_sessions()  # answered after the cancel was taken
            if gateway == "connects":
                hello.set()
            else:  # the socket closes before hello-ok: the connect fails
                assert gw._server is not None
                for ws in list(gw._server.connections):
                    await ws.close()
            assert (await asyncio.wait_for(turn, 15)).stop_reason == "cancelled"
    finally:
        hello.set()
        await gw.stop()


async def test_client_mcp_servers_reach_a_stdio_agent_that_accepts_them(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """ACP agents take stdio MCP servers in session/new: the client's reach a stdio agent
    whose provider has client_mcp_servers (it starts them), not one without, and
    never an HTTP upstream; malformed ones are a -32602."""
    from acp.schema import EnvVariable, McpServerStdio

    cfg = config(fake_upstream, tmp_path)
    cfg["providers"] = [
        cfg["providers"][0],
        agent_provider(client_mcp_servers=True),
        agent_provider("closed"),
    ]
    toolbridge = McpServerStdio(
        name="tb",
        command=sys.executable,
        args=["-m", "xwm_bridge", "toolbridge"],
        env=[EnvVariable(name="MCP_CLIENT_SECRET", value="client-mcp-value-31")],
    )
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[toolbridge])
        sid = session.session_id
        await acp.conn.prompt(session_id=sid, prompt=prompt("to codex"))
        assert "mcpServers" not in fake_upstream.state.requests[-1]["params"]
        await acp.conn.set_config_option(
            config_id="route", session_id=sid, value="single-agent:fake"
        )
        await acp.conn.prompt(session_id=sid, prompt=prompt("mcp"))
        assert acp.checker.text().endswith("mcp: tb:stdio")
        await acp.conn.prompt(session_id=sid, prompt=prompt("mcp-tools tb"))
        assert acp.checker.text().endswith("tools: chat,claude_review,vault_kv")

        other = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[toolbridge])
        await acp.conn.set_config_option(
            config_id="route", session_id=other.session_id, value="single-agent:closed"
        )
        answer = await acp.conn.prompt(session_id=other.session_id, prompt=prompt("mcp"))
        assert answer.stop_reason == "end_turn" and acp.checker.text().endswith("mcp: ")

        with pytest.raises(RequestError) as err:
            await acp.conn.new_session(
                cwd=str(tmp_path),
                mcp_servers=[McpServerStdio(name="x", command="", args=[], env=[])],
            )
        assert err.value.code == -32602 and "command" in str(err.value)
