"""``claude_review`` in-process, on both event loops (tests/integration/
test_toolbridge_mcp.py runs it in the ``toolbridge`` process, on uvloop only)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.integration.test_toolbridge_mcp import fake_claude  # noqa: F401 (a fixture)
from tests.markers import both_loops
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.toolbridge.tools import ToolError, claude_review


@both_loops
async def test_a_process_the_cli_left_on_its_output_does_not_hold_the_review(
    fake_claude: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the default loop ``Process.wait()`` also waits for the pipes, which the
    CLI's child holds: the review that had finished timed out."""
    script, log = fake_claude
    monkeypatch.setenv("FAKE_CLAUDE_LOG", str(log))
    cfg = ToolbridgeConfig(claude_bin=str(script), claude_review_timeout=8)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await claude_review(cfg, {"prompt": "holder"}) == "reviewed: holder"
    assert loop.time() - started < 5


@both_loops
async def test_a_failing_cli_and_its_deadline(
    fake_claude: tuple[Path, Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script, log = fake_claude
    monkeypatch.setenv("FAKE_CLAUDE_LOG", str(log))
    cfg = ToolbridgeConfig(claude_bin=str(script), claude_review_timeout=0.5)
    with pytest.raises(ToolError, match="bad flag"):
        await claude_review(cfg, {"prompt": "fail"})
    with pytest.raises(ToolError, match="timed out"):
        await claude_review(cfg, {"prompt": "sleep"})
