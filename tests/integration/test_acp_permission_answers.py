"""How the bridge takes an ACP client's answer to ``session/request_permission`` that
selects none of the offered options: a ``cancelled`` outcome with no reject option to
pick, an option id that was not offered, a JSON-RPC error. The agent is answered
``cancelled`` at once (ACP: it must not go on with the tool), not left waiting until
``agents.permission_timeout``. The in-process daemon, the SDK's WebSocket client, the
scripted stdio agent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import FakeUpstream, StartBridge, wait_until
from tests.integration.acp_helpers import RecordingClient, prompt
from tests.integration.test_acp_remote import config, sdk_client

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


@pytest.mark.parametrize("answer", ["cancelled", "unknown", "error"])
async def test_an_answer_that_picks_no_option_ends_the_wait_at_once(
    answer: str, start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # permission_timeout is far beyond the bound below: only the client's answer ends it
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    cfg["agents"]["permission_timeout"] = 600
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    client = RecordingClient(permission=answer)
    async with sdk_client(f"{bp.url}/acp/remote", "ws", client) as (conn, _, checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        # "oddpermission" offers one option, allow_once: there is no reject option
        done = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=prompt("oddpermission")), 30
        )
        assert done.stop_reason == "end_turn" and len(client.asked) == 1
        assert "odd permission: cancelled" in checker.text()
    broker = bp.bridge.permissions
    await wait_until(lambda: not broker.snapshot(), within=10)
    (record,) = [r for r in broker.resolved if r.session_id == session.session_id]
    assert record.outcome == "cancelled" and record.resolution == "cancelled"
