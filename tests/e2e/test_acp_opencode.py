"""e2e: an ACP client (the official SDK's) drives ``xwm-bridge acp`` routed to the real
``opencode acp`` agent, pointed at the in-repo fake LLM."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from internal.peers.fake_llm import STATE_KEY, create_app
from tests.conftest import ServeApp, wait_until
from tests.e2e.agent_peers import opencode_provider
from tests.e2e.test_opencode_agent import slow_call_since, write_tool
from tests.integration.acp_helpers import prompt, spawn_acp

pytestmark = [pytest.mark.asyncio, pytest.mark.e2e, pytest.mark.timeout(240)]


async def test_acp_client_through_the_bridge_to_opencode(
    tmp_path: Path, serve_app: ServeApp
) -> None:
    app = create_app()
    llm_url = await serve_app(app)
    llm = app[STATE_KEY]
    work = tmp_path / "work"
    work.mkdir()
    config = {
        "providers": [opencode_provider(tmp_path, llm_url, work)],
        "allowed_roots": [str(tmp_path)],
        "agents": {"initialize_timeout": 60, "session_timeout": 60, "prompt_timeout": 120},
        "acp": {"default_route": "single-agent:opencode"},
    }
    async with spawn_acp(tmp_path, config) as acp:
        session = await acp.conn.new_session(cwd=str(work), mcp_servers=[])
        sid = session.session_id

        # 1. a streamed reply
        answer = await acp.conn.prompt(session_id=sid, prompt=prompt("hello there"))
        assert answer.stop_reason == "end_turn"
        assert acp.checker.text() == "FAKE-LLM says: hello there"
        assert len(acp.checker.updates("agent_message_chunk")) >= 2

        # 2. opencode asks permission for a file write: the ACP client answers
        target = work / "approved.txt"
        llm.script.extend(write_tool(target)["replies"])
        answer = await acp.conn.prompt(session_id=sid, prompt=prompt("write it"))
        assert answer.stop_reason == "end_turn"
        assert acp.client.asked, "the permission request reached the ACP client"
        assert target.read_text() == "hi from tool"

        # 3. cancel mid-turn, then the session goes on
        before = len(llm.requests)
        turn = asyncio.ensure_future(
            acp.conn.prompt(session_id=sid, prompt=prompt("slow:20000 take your time"))
        )
        await wait_until(lambda: slow_call_since(llm, before), within=60)
        await acp.conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(turn, 30)).stop_reason == "cancelled"
        answer = await acp.conn.prompt(session_id=sid, prompt=prompt("and now"))
        assert answer.stop_reason == "end_turn"
        assert acp.checker.text().endswith("FAKE-LLM says: and now")
