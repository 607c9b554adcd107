"""JSON-RPC batches over the real stdio process: served when ``initialize`` negotiated
2025-03-26 (MCP: implementations MUST support receiving them), refused otherwise."""

from __future__ import annotations

import asyncio
import stat
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from internal.peers.fake_llm import create_app
from tests.conftest import ServeApp
from tests.integration.test_toolbridge_mcp import FAKE_CLAUDE, _raw
from tests.mcp_client import toolbridge_env
from xwm_bridge import jsonrpc


@pytest.fixture
async def llm_url(serve_app: ServeApp) -> str:
    return await serve_app(create_app())


@pytest.fixture
def fake_claude(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "claude"
    script.write_text(FAKE_CLAUDE.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, tmp_path / "claude.log"


def _initialize(version: str) -> bytes:
    return (
        orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": version},
            }
        )
        + b"\n"
    )


def _batch_lines(replies: list[Any]) -> tuple[list[Any], list[Any]]:
    """The replies split into the initialize answer(s) and everything else."""
    init = [r for r in replies if isinstance(r, dict) and r.get("id") == 0]
    return init, [r for r in replies if r not in init]


async def test_a_mixed_batch_is_answered_in_one_array(fake_claude: tuple[Path, Path]) -> None:
    """MCP 2025-03-26: implementations MUST support receiving JSON-RPC batches. Each
    element is answered independently (its errors with its id rules), notifications and
    responses get no entry, and the answers come back as one JSON array on one line.
    A batch was ``-32700 invalid json: expected a JSON object, got array``."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": "r",
            "method": "tools/call",
            "params": {"name": "claude_review", "arguments": {"prompt": "diff"}},
        },
        {"jsonrpc": "2.0", "id": None, "method": "ping"},
        {"jsonrpc": "2.0", "id": 7, "result": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "nope"}},
        {"jsonrpc": "2.0", "id": 3, "method": "initialize", "params": {}},
        5,
    ]
    replies = await _raw(
        _initialize("2025-03-26")
        + b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'
        + orjson.dumps(batch)
        + b"\n",
        env,
    )
    init, rest = _batch_lines(replies)
    assert init[0]["result"]["protocolVersion"] == "2025-03-26"
    assert rest == [
        [
            jsonrpc.result(1, {}),
            jsonrpc.result("r", {"content": [{"type": "text", "text": "reviewed: diff"}]}),
            jsonrpc.error(None, -32600, "invalid request: id must not be null"),
            jsonrpc.error(2, -32601, "unknown tool: nope"),
            jsonrpc.error(
                3, -32600, "invalid request: initialize must not be part of a JSON-RPC batch"
            ),
            jsonrpc.error(None, -32600, "invalid request: expected a JSON object, got number"),
        ]
    ]


async def test_an_empty_batch_and_an_all_notification_batch() -> None:
    """JSON-RPC 2.0: ``[]`` is one ``-32600`` (not an array); a batch of notifications
    gets no output at all."""
    notifications = [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}},
    ]
    replies = await _raw(
        _initialize("2025-03-26")
        + b"[]\n"
        + orjson.dumps(notifications)
        + b"\n"
        + b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'
    )
    init, rest = _batch_lines(replies)
    assert len(init) == 1
    assert sorted(rest, key=lambda r: str(r["id"])) == [
        jsonrpc.result(1, {}),
        jsonrpc.error(None, -32600, "invalid request: empty batch"),
    ]


async def test_a_batch_too_large_is_refused_whole(fake_claude: tuple[Path, Path]) -> None:
    """One frame cannot start unbounded work: past ``max_concurrent_calls`` +
    ``MAX_WAITING`` messages (24 by default) the batch is one ``-32600``, none of it run."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    call = {
        "jsonrpc": "2.0",
        "method": "tools/call",
        "params": {"name": "claude_review", "arguments": {"prompt": "x"}},
    }
    batch = [{**call, "id": i} for i in range(25)]
    replies = await _raw(_initialize("2025-03-26") + orjson.dumps(batch) + b"\n", env)
    _, rest = _batch_lines(replies)
    assert rest == [
        jsonrpc.error(
            None, -32600, "invalid request: a batch of 25 messages exceeds the limit of 24"
        )
    ]
    assert not log.exists()  # the CLI was never started


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25", "2024-11-05", None])
async def test_a_batch_is_refused_outside_2025_03_26(
    fake_claude: tuple[Path, Path], version: str | None
) -> None:
    """2025-06-18 removed batching (2024-11-05 never had it) and nothing may come before
    ``initialize``: a batch is one clear ``-32600`` naming why, never run (it was
    ``-32700 invalid json``, as if the JSON were broken)."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    batch = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "claude_review", "arguments": {"prompt": "x"}},
        },
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    head = b"" if version is None else _initialize(version)
    replies = await _raw(head + orjson.dumps(batch) + b"\n", env)
    _, rest = _batch_lines(replies)
    why = "before initialize" if version is None else f"in protocol version {version}"
    assert rest == [
        jsonrpc.error(None, -32600, f"invalid request: batches are not supported {why}")
    ]
    assert not log.exists()


async def test_a_cancel_reaches_a_call_inside_a_batch(llm_url: str) -> None:
    """``notifications/cancelled`` naming a call inside a batch abandons it: the batch's
    array holds the other answers only, and the process does not wait the call out."""
    env = toolbridge_env(LLM_API_KEY="sk-1", LLM_BASE_URL=llm_url)
    batch = [
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tools/call",
            "params": {"name": "chat", "arguments": {"prompt": "slow:30000 x"}},
        },
        {"jsonrpc": "2.0", "id": "p", "method": "ping"},
    ]
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": "slow"},
    }
    started = asyncio.get_running_loop().time()
    replies = await _raw(
        _initialize("2025-03-26") + orjson.dumps(batch) + b"\n" + orjson.dumps(cancel) + b"\n", env
    )
    _, rest = _batch_lines(replies)
    assert rest == [[jsonrpc.result("p", {})]]
    assert asyncio.get_running_loop().time() - started < 15
