"""``xwm-bridge acp`` and a frame past ``limits.max_body_bytes``: a prompt too large is
answered by its id (an error the client's request gets, instead of an id-null error it
cannot match, leaving the prompt waiting for ever), and a client's answer too large
fails the bridge's request at once (not at its deadline). The stream goes on."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest
from acp import RequestError, schema

from tests.conftest import ROOT, FakeUpstream, base_env
from tests.integration.acp_helpers import RecordingClient, caps, prompt, spawn_acp, write_config
from tests.integration.test_acp_stdio import config

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

LIMIT = 64 * 1024


async def test_a_prompt_past_the_limit_gets_its_error_by_its_id(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    cfg = config(fake_upstream, tmp_path, limits={"max_body_bytes": LIMIT})
    big = schema.EmbeddedResourceContentBlock(
        type="resource",
        resource=schema.TextResourceContents(uri="file:///big.txt", text="x" * (2 * LIMIT)),
    )
    async with spawn_acp(tmp_path, cfg) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        with pytest.raises(RequestError) as err:
            await asyncio.wait_for(acp.conn.prompt(session_id=session.session_id, prompt=[big]), 20)
        assert err.value.code == -32602 and f"limit is {LIMIT} bytes" in str(err.value)
        answer = await acp.conn.prompt(session_id=session.session_id, prompt=prompt("after"))
        assert answer.stop_reason == "end_turn" and acp.checker.text() == "echo: after"


async def test_a_client_answer_past_the_limit_fails_the_request_at_once(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    # the relayed fs/read_text_file would otherwise wait agents.session_timeout
    cfg = config(
        fake_upstream,
        tmp_path,
        limits={"max_body_bytes": LIMIT},
        acp={"default_route": "single-agent:fake"},
    )
    cfg["agents"]["session_timeout"] = 600
    path = str(tmp_path / "huge.txt")
    client = RecordingClient(files={path: "y" * (2 * LIMIT)})
    async with spawn_acp(tmp_path, cfg, client=client, capabilities=caps(fs=True)) as acp:
        session = await acp.conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        answer = await asyncio.wait_for(
            acp.conn.prompt(session_id=session.session_id, prompt=prompt(f"read {path}")), 30
        )
        assert answer.stop_reason == "end_turn"
        assert "read error -32603" in acp.checker.text()


async def test_a_content_length_frame_past_the_limit_gets_its_error_by_its_id(
    fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Such a frame was refused unread, its error with id null: the client's request was
    never answered. The stream stays in step: the next frame is answered."""
    cfg = config(fake_upstream, tmp_path, limits={"max_body_bytes": LIMIT})
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "acp",
        "--config",
        str(write_config(tmp_path, cfg)),
        env=base_env(),
        cwd=str(ROOT),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert proc.stdin is not None and proc.stdout is not None
    pad = "x" * (LIMIT + (1 << 20))
    big = {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"pad": pad}}
    body = orjson.dumps(big)
    proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    proc.stdin.write(
        b'{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":1}}\n'
    )
    await proc.stdin.drain()
    error = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
    assert error["id"] == 5 and error["error"]["code"] == -32602
    assert f"limit is {LIMIT} bytes" in error["error"]["message"]
    answer = orjson.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
    assert answer["id"] == 6 and answer["result"]["protocolVersion"] == 1
    proc.stdin.close()
    assert await asyncio.wait_for(proc.wait(), 30) == 0
