"""observability.logging: redaction and field caps of every log line (issue 16 items 11, 12)."""

from __future__ import annotations

import orjson

from tests.nesting import nested
from xwm_bridge.observability.logging import MAX_FIELD_CHARS, Redactor, _Clock, render_line


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


def test_big_containers_are_shortened() -> None:
    out = render_line(Redactor(), _Clock(), 0.0, "info", "t", "m", {"ids": ["x" * 100] * 10_000})
    assert len(out) < 3 * MAX_FIELD_CHARS


def test_deep_values_do_not_break_the_line() -> None:
    doc = line(Redactor(("k",)), {"v": nested(400)})
    assert isinstance(doc["v"], str)
