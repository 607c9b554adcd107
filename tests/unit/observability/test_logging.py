"""Log line rendering: JSON by default, ``key=value`` text for a terminal (issue 15 item 11),
secrets redacted either way."""

from __future__ import annotations

import logging

from xwm_bridge.observability import logging as obslog


def render(text: bool, **fields: object) -> bytes:
    return obslog.render_line(
        obslog.Redactor(["s3cr3t-token"]),
        obslog._Clock(),
        0.25,
        "warning",
        "xwm_bridge.turns",
        "turn finished",
        dict(fields),
        "Traceback (most recent call last):\n  boom",
        text=text,
    )


def test_text_lines_are_key_value_and_redacted() -> None:
    line = render(True, session_id="s1", error="denied s3cr3t-token", ok=False, n=3, d={"a": 1})
    assert line.endswith(b"\n")
    first, *rest = line.decode().rstrip("\n").split("\n")
    assert first.startswith("1970-01-01T00:00:00.250Z WARNING xwm_bridge.turns: turn finished ")
    assert 'session_id=s1 error="denied [REDACTED]" ok=false n=3 d={"a":1}' in first
    assert rest == ["    Traceback (most recent call last):", "      boom"]


def test_json_stays_the_default() -> None:
    line = render(False, session_id="s1", error="denied s3cr3t-token")
    assert line.startswith(b'{"ts":"1970-01-01T00:00:00.250Z","level":"warning"')
    assert b"[REDACTED]" in line and b"s3cr3t" not in line


def test_auto_is_text_only_on_a_terminal(tmp_path: object) -> None:
    import os
    import pty

    leader, follower = pty.openpty()
    read, write = os.pipe()
    try:
        assert obslog.text_format("auto", follower) is True
        assert obslog.text_format("auto", write) is False
        assert obslog.text_format("json", follower) is False
        assert obslog.text_format("text", write) is True
    finally:
        for fd in (leader, follower, read, write):
            os.close(fd)


def test_setup_logging_text_reaches_both_paths() -> None:
    lines: list[bytes] = []
    sink = obslog.setup_logging("info", ("hunter22",), write=lines.append, log_format="text")
    try:
        logging.getLogger("xwm_bridge.t").info("stdlib line", extra={"k": "hunter22"})
        obslog.events.info("xwm_bridge.e", "fast line", {"k": 1})
        sink.flush()
    finally:
        obslog.setup_logging("info", write=lambda _: None)
        logging.getLogger().handlers[:] = []
        obslog.events.configure(None, obslog.Redactor(), logging.INFO)
    text = b"".join(lines).decode()
    assert "INFO    xwm_bridge.t: stdlib line k=[REDACTED]" in text
    assert "INFO    xwm_bridge.e: fast line k=1" in text
