"""Log line rendering: JSON by default, ``key=value`` text for a terminal (issue 15 item 11),
secrets redacted either way, and every field capped (issue 16 items 11, 12)."""

from __future__ import annotations

import logging

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.nesting import nested
from xwm_bridge.observability import logging as obslog
from xwm_bridge.observability.logging import MAX_FIELD_CHARS, Redactor, _Clock, render_line


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


# --- issue 16: escaped and short secrets, field caps ----------------------------------


def line(redactor: Redactor, fields: dict[str, object], msg: str = "m") -> dict[str, object]:
    out = render_line(redactor, _Clock(), 0.0, "info", "t", msg, fields)
    assert out.endswith(b"\n")
    doc = orjson.loads(out)
    assert isinstance(doc, dict)
    return doc


def test_tokens_with_quotes_or_backslashes_are_redacted_in_logs() -> None:
    token = 'ab"c\\d-secret'
    raw = render_line(Redactor((token,)), _Clock(), 0.0, "info", "t", "m", {"e": f"x {token}"})
    assert orjson.dumps(token)[1:-1] not in raw
    assert orjson.loads(raw)["e"] == "x [REDACTED]"


def test_short_secrets_are_redacted_in_logs() -> None:
    assert line(Redactor(("abc",)), {"e": "key abc here"})["e"] == "key [REDACTED] here"


def test_redaction_keeps_the_line_valid_json_and_the_keys() -> None:
    doc = line(Redactor(("e",)), {"error": "e e"})  # a secret that is also in key names
    assert doc["error"] == "[REDACTED] [REDACTED]" and doc["level"] == "info"


def test_secrets_inside_repr_of_objects_are_redacted() -> None:
    doc = line(Redactor(("tok-123",)), {"exc": ValueError("bad tok-123")})
    assert "tok-123" not in orjson.dumps(doc).decode()


def test_client_supplied_fields_are_capped() -> None:
    big = "s" * 3_000_000
    out = render_line(Redactor(), _Clock(), 0.0, "info", "t", big, {"session_id": big})
    assert len(out) < 3 * MAX_FIELD_CHARS + 500
    doc = orjson.loads(out)
    assert str(doc["session_id"]).startswith("s" * MAX_FIELD_CHARS)
    assert "chars)" in str(doc["session_id"])


def test_a_secret_across_the_field_cap_is_redacted_before_the_cut() -> None:
    """A long value was cut at the cap first and redacted after: a secret straddling
    the cut was no longer whole, so its first characters reached the log."""
    token = "s3cr3t-token-0123456789"
    value = "x" * (MAX_FIELD_CHARS - 8) + token + " tail"
    exc = "y" * (obslog.MAX_EXC_CHARS - 8) + token
    big = ["z" * (MAX_FIELD_CHARS - 8) + token, *["w" * 100] * 1000]  # over the line cap
    for as_text in (False, True):
        for fields in ({"error": value}, {"ids": big}):
            out = render_line(
                Redactor((token,)), _Clock(), 0.0, "info", "t", value, fields, exc, text=as_text
            )
            assert b"s3cr3t" not in out, (as_text, list(fields))
    doc = orjson.loads(
        render_line(Redactor((token,)), _Clock(), 0.0, "info", "t", "m", {"error": value})
    )
    assert str(doc["error"]).startswith("x" * (MAX_FIELD_CHARS - 8) + "[REDACTE…(+7 chars)")


def test_big_containers_are_shortened() -> None:
    out = render_line(Redactor(), _Clock(), 0.0, "info", "t", "m", {"ids": ["x" * 100] * 10_000})
    assert len(out) < 3 * MAX_FIELD_CHARS


def test_a_number_past_64_bits_does_not_break_the_line() -> None:
    # orjson refuses it, and the fallback kept ints as they were: render_line raised
    doc = line(Redactor(("k",)), {"n": 2**64, "m": -(2**63) - 1, "ok": 2**64 - 1})
    assert doc["n"] == str(2**64) and doc["m"] == str(-(2**63) - 1) and doc["ok"] == 2**64 - 1


def test_deep_values_do_not_break_the_line() -> None:
    doc = line(Redactor(("k",)), {"v": nested(400)})
    assert isinstance(doc["v"], str)


def _reference_line(redactor: Redactor, msg: str, fields: dict[str, object], exc: str) -> bytes:
    """The line as rendered before the short-line fast path: every string field
    capped (redacted before the cut) first, then encoded (the fast path must give the
    same bytes)."""
    entry: dict[str, object] = {"ts": _Clock().stamp(0.0), "level": "info", "logger": "t"}
    entry["msg"] = obslog._cap(msg, MAX_FIELD_CHARS, redactor)
    entry.update(obslog._capped(fields, redactor))
    if exc:
        entry["exc"] = obslog._cap(exc, obslog.MAX_EXC_CHARS, redactor)
    try:
        line = orjson.dumps(entry, default=repr)
    except TypeError:  # an int past 64 bits, or nested deeper than orjson writes
        entry = obslog._scalars(entry, redactor)
        line = orjson.dumps(entry)
    if len(line) > obslog.MAX_LINE_BYTES:
        line = orjson.dumps(obslog._scalars(entry, redactor))
    if redactor.hit(line):
        line = orjson.dumps(redactor.value(orjson.loads(line)))
    return line + b"\n"


_near_cap = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["s", "é", "\u6587", '"', "\n"]),
    st.integers(0, MAX_FIELD_CHARS + 40) | st.integers(MAX_FIELD_CHARS - 3, MAX_FIELD_CHARS + 3),
)
_field_values = _near_cap | st.integers() | st.booleans() | st.lists(_near_cap, max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(["session_id", "error", "exc", "msg", "ts", "k1", "k2", "k3"]),
        _field_values,
        max_size=6,
    ),
    exc=st.sampled_from(["", "Traceback: boom", "x" * (obslog.MAX_EXC_CHARS + 5)]),
)
@example(fields={"session_id": -(2**63) - 1, "error": "e" * 3000}, exc="")  # orjson refuses the int
def test_short_lines_skip_the_cap_pass_and_render_the_same(
    fields: dict[str, object], exc: str
) -> None:
    redactor = Redactor(["s3cr3t-token"])
    got = render_line(redactor, _Clock(), 0.0, "info", "t", "m", dict(fields), exc)
    assert got == _reference_line(redactor, "m", fields, exc)


def test_capped_masks_a_secret_across_the_cut() -> None:
    secret = "sk-live-0123456789abcdef"
    events = obslog.events
    saved = events._sink, events._redactor, events.level
    events.configure(None, Redactor([secret]), logging.INFO)  # as setup_logging does
    try:
        text = "x" * 490 + secret + "y" * 100  # the secret straddles character 500
        out = obslog.capped(text, 500)
        assert len(out) == 500
        assert secret[:5] not in out and out.startswith("x" * 490 + "[REDAC")
        assert obslog.capped("short " + secret, 500) == "short " + secret  # uncut: left
    finally:  # to the line's own redaction
        events.configure(*saved)


def test_a_secret_in_a_key_is_redacted_in_logs_and_on_the_wire() -> None:
    """Only values were rewritten: a document whose secret was a key (an env or header map
    keyed by the token, a path holding it) was re-encoded with the secret still there."""
    token = "tok-SECRET-123456"
    red = Redactor((token,))
    doc = line(red, {"env": {token: "v", f"/srv/{token}/x": 1}, "error": "e"})
    assert token not in orjson.dumps(doc).decode()
    assert doc["env"] == {"[REDACTED]": "v", "/srv/[REDACTED]/x": 1}
    wire = red.dumps({"jsonrpc": "2.0", "result": {"changes": {token: {"type": "add"}}}})
    assert token.encode() not in wire
    assert orjson.loads(wire)["result"]["changes"] == {"[REDACTED]": {"type": "add"}}


def test_short_secrets_still_keep_the_protocol_keys() -> None:
    # a secret shorter than KEY_SECRET_LEN is masked in values only: names such as
    # "type" or "sessionId" stay what the protocol says
    red = Redactor(("type", "Id"))
    out = orjson.loads(red.dumps({"type": "type x", "sessionId": "Id"}))
    assert out == {"type": "[REDACTED] x", "sessionId": "[REDACTED]"}
