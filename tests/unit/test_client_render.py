"""The terminal client's pure parts: URLs, tables, event lines, progress, choices."""

from __future__ import annotations

import io
from typing import Any, ClassVar

import pytest

from xwm_bridge.client import (
    ClientError,
    Progress,
    choose,
    event_line,
    json_text,
    listen_url,
    permission_prompt,
    run_turn,
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


#: what an agent's tool call (its title is often the command it runs), an option or a
#: prompt can hold: cursor moves that overwrite a line, a line break that adds a line, a
#: terminal title or clipboard write (OSC), a right-to-left override
HOSTILE = (
    "cat notes\x1b[2K\r\x1b[1Als\n  1) Allow [allow_once]\x1b]52;c;Y3VybA==\x07\u202egnp.x\x9b"
)


def visible(text: str) -> None:
    bad = [c for c in text if c not in "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0)]
    assert not bad and "\u202e" not in text, repr(text)


def test_what_the_bridge_sends_cannot_drive_the_terminal() -> None:
    """The permission prompt, the watch lines and the session table wrote the agent's
    strings as they came: an escape sequence in a tool call's title rewrote the prompt
    the operator answers (another command shown, a fake "1) Allow" line), set the
    terminal's title or clipboard. Control characters are shown escaped instead."""
    ask = {
        "requestId": "perm-1" + HOSTILE,
        "toolCall": {"title": HOSTILE},
        "options": [{"optionId": "once", "name": HOSTILE, "kind": HOSTILE}],
    }
    prompt = permission_prompt(ask)
    visible(prompt)
    assert prompt.count("\n") == 2  # its own lines: the request, one option, the question
    assert "\\x1b[2K" in prompt and "\\n" in prompt and "\\u202e" in prompt
    for event in (
        {"kind": "permission", "type": "requested", "sessionId": HOSTILE, **ask},
        {"kind": "permission", "type": "resolved", "sessionId": "s", "requestId": "p",
         "outcome": HOSTILE, "answeredBy": {"transport": HOSTILE, "address": HOSTILE}},
        {"kind": "turn", "type": "update", "sessionId": "s",
         "update": {"type": "tool_call", "title": HOSTILE, "status": HOSTILE}},
        {"kind": "turn", "type": "finished", "sessionId": "s", "status": HOSTILE,
         "turnId": HOSTILE},
        {"kind": "session", "type": HOSTILE, "sessionId": "s"},
    ):  # fmt: skip
        line = event_line(event)
        assert line is not None and "\n" not in line
        visible(line)
    rows = [{"sessionId": HOSTILE, "state": HOSTILE, "provider": HOSTILE, "updatedAt": 95.0,
             "lastTurn": {"prompt": HOSTILE}}]  # fmt: skip
    table = session_table(rows, now=100.0)
    visible(table)
    assert table.count("\n") == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class OneTurn:
    """A bridge that streams one hostile chunk, then ends the turn with a hostile error."""

    on_notification: Any = None

    async def call(self, method: str, params: dict[str, Any], wait_s: Any = 0) -> Any:
        chunk = {"sessionId": "s1", "type": "delta", "delta": "line 1\n\tline 2 " + HOSTILE}
        self.on_notification({"method": "session.update", "params": chunk})
        return {"success": False, "error": HOSTILE}


async def test_a_turns_output_cannot_drive_the_terminal_it_is_shown_on() -> None:
    """``client run``'s output shares the screen with the permission prompts: an escape
    sequence in the model's output moved the cursor up and rewrote them. On a terminal
    it is shown escaped, its line breaks and tabs kept; piped, it is written as it came."""

    async def no_input() -> str:
        return ""

    out, err = Terminal(), Terminal()
    await run_turn(OneTurn(), {"sessionId": "s1"}, out, err, no_input)  # type: ignore[arg-type]
    assert out.getvalue().startswith("line 1\n\tline 2 cat notes\\x1b[2K\\r")
    visible(out.getvalue().replace("\t", " "))
    visible(err.getvalue().replace("\r\x1b[2K", ""))  # its own progress line's erase
    piped = io.StringIO()
    await run_turn(OneTurn(), {"sessionId": "s1"}, piped, io.StringIO(), no_input)  # type: ignore[arg-type]
    assert piped.getvalue() == "line 1\n\tline 2 " + HOSTILE + "\n"


class TwoReplicas:
    """permission.list of a cluster whose replicas both hold a pending ``perm-3`` (ids
    each counted from perm-1: bridges before the ids had a tag)."""

    answered: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, url: str, token: str) -> None:
        pass

    async def __aenter__(self) -> TwoReplicas:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def call(self, method: str, params: dict[str, Any], wait_s: Any = 0) -> Any:
        if method == "permission.list":
            return {"requests": [{"sessionId": s, "requestId": "perm-3"} for s in ("a", "b")]}
        self.answered.append(params)
        return {"outcome": "allow_once"}


def test_approve_refuses_a_request_id_two_sessions_have(monkeypatch: pytest.MonkeyPatch) -> None:
    """``client approve perm-3 once`` answered the first pending request of that id it
    listed: with two (two replicas, or a bridge of before the ids had a tag) it could
    allow another session's tool call than the one the operator read. It names them."""
    from click.testing import CliRunner

    import xwm_bridge.client
    from xwm_bridge.cli.group import cli

    monkeypatch.setattr(xwm_bridge.client, "Client", TwoReplicas)
    monkeypatch.setattr(TwoReplicas, "answered", [])
    monkeypatch.setenv("XWM_AGENTS_DETECT", "false")
    result = CliRunner().invoke(
        cli, ["client", "--url", "http://127.0.0.1:9", "approve", "perm-3", "once"]
    )
    assert result.exit_code == 1 and TwoReplicas.answered == [], result.output
    assert "perm-3 is pending in 2 sessions (a, b)" in result.output


def test_json_text_escapes_what_a_terminal_would_act_on() -> None:
    import orjson

    value = {"t": "a\u202eb\x9b[2J\x7f\u2028\u2069 é ✓", "n": [1, "\x1b"]}
    for indent in (False, True):
        out = json_text(value, indent=indent)
        assert not any(0x7F <= ord(c) < 0xA0 or c in "\u202e\u2028\u2069\x1b" for c in out)
        assert "é ✓" in out  # printable text stays as it is
        assert orjson.loads(out) == value
    assert json_text({"a": 1}) == '{"a":1}'
    assert json_text({"a": 1}, indent=True) == '{\n  "a": 1\n}'
