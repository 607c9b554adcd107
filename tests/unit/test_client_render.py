"""The terminal client's pure parts: URLs, tables, event lines, progress, choices."""

from __future__ import annotations

import pytest

from xwm_bridge.client import (
    ClientError,
    Progress,
    choose,
    event_line,
    listen_url,
    permission_prompt,
    session_table,
    ws_url,
)


def test_urls() -> None:
    assert ws_url("http://127.0.0.1:8787") == "ws://127.0.0.1:8787/acp"
    assert ws_url("https://bridge.example") == "wss://bridge.example/acp"
    assert ws_url("127.0.0.1:9") == "ws://127.0.0.1:9/acp"
    with pytest.raises(ClientError):
        ws_url("ftp://x")
    # a malformed --url is a clear error, not a traceback or aiohttp's bare URL
    for bad in ("http://[::1", "http://127.0.0.1:99999", "http://h:port"):
        with pytest.raises(ClientError, match="not a bridge URL"):
            ws_url(bad)
    assert ws_url("http://[::1]:8787") == "ws://[::1]:8787/acp"
    assert listen_url("0.0.0.0:8787") == "http://127.0.0.1:8787"
    assert listen_url("127.0.0.1:1234") == "http://127.0.0.1:1234"


def test_table_and_lines() -> None:
    rows = [{"sessionId": "s1", "state": "running", "provider": "codex", "updatedAt": 95.0,
             "lastTurn": {"prompt": "do\nthings"}}]  # fmt: skip
    table = session_table(rows, now=100.0).splitlines()
    assert table[0].split() == ["SESSION", "STATE", "PROVIDER", "UPDATED", "LAST", "PROMPT"]
    assert table[1].split() == ["s1", "running", "codex", "5s", "ago", "do", "things"]
    asked = {
        "kind": "permission",
        "type": "requested",
        "sessionId": "s1",
        "requestId": "perm-1",
        "toolCall": {"title": "Write x"},
        "options": [{"optionId": "once"}],
        "ts": 0,
    }
    assert event_line(asked).endswith("s1 permission perm-1 asks: Write x [once]")  # type: ignore[union-attr]
    done = {**asked, "type": "resolved", "outcome": "allow_once",
            "answeredBy": {"transport": "console", "address": "127.0.0.1:1"}}  # fmt: skip
    assert event_line(done).endswith("perm-1 allow_once by console 127.0.0.1:1")  # type: ignore[union-attr]
    assert event_line({"kind": "watch", "type": "live"}) is None


def test_progress_and_choices() -> None:
    p = Progress(started=0.0)
    p.observe({"type": "delta", "delta": "hello "})
    p.observe({"type": "tool_call"})
    p.observe({"type": "permission", "pending": True})
    assert "waiting for permission · 2.0s · 6 chars · 1 tool call" in p.line(now=2.0)
    options = [{"optionId": "once", "name": "Allow", "kind": "allow_once"}, {"optionId": "no"}]
    assert "1) Allow [allow_once]" in permission_prompt({"requestId": "perm-1", "options": options})
    assert choose(options, "1\n") == "once" and choose(options, "no") == "no"
    assert choose(options, "3") is None and choose(options, "") is None


@pytest.mark.parametrize(
    "answer", ["²", "١", "１", pytest.param("9" * 5000, id="5000-digits"), "٢²"]
)
def test_a_non_ascii_or_huge_number_is_no_choice(answer: str) -> None:
    """Terminal input: "²" passed ``str.isdigit`` and ``int()`` raised (a traceback that
    ended the client), "١" chose option 1, 5,000 digits passed the 4,300-digit limit."""
    options = [{"optionId": "once"}, {"optionId": "no"}]
    assert choose(options, answer) is None
    assert choose([{"optionId": "²"}], "²") == "²"  # an option id is still matched
