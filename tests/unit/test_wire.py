"""xwm_bridge.wire: what goes to a client is encoded once, redacted, and never raises
(issue 16 items 3 and 11)."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.nesting import nested
from xwm_bridge import jsonrpc
from xwm_bridge.wire import UNENCODABLE, WireEncoder


def test_a_response_that_cannot_be_encoded_becomes_an_internal_error_with_its_id() -> None:
    wire = WireEncoder()
    data = wire.encode(jsonrpc.result("r1", {"deep": nested(300)}))
    assert data is not None
    assert orjson.loads(data) == jsonrpc.error("r1", jsonrpc.INTERNAL_ERROR, UNENCODABLE)
    assert wire.dropped == 1


def test_an_unencodable_id_is_answered_with_null() -> None:
    data = WireEncoder().encode(jsonrpc.error(nested(300), -32600, "x"))
    assert data is not None and orjson.loads(data)["id"] is None


def test_a_notification_that_cannot_be_encoded_is_dropped() -> None:
    wire = WireEncoder()
    assert wire.encode(jsonrpc.notification("session.update", {"d": nested(300)})) is None
    assert wire.dropped == 1


def test_secrets_in_values_are_redacted_keys_kept() -> None:
    wire = WireEncoder(("s3cret-token",))
    message = jsonrpc.result(1, {"error": "upstream said: Authorization: Bearer s3cret-token"})
    out = orjson.loads(wire.encode(message) or b"")
    assert out["result"]["error"] == "upstream said: Authorization: Bearer [REDACTED]"


def test_tokens_with_quotes_and_backslashes_are_redacted() -> None:
    token = 'to"ken\\with-escapes'
    wire = WireEncoder((token,))
    data = wire.encode(jsonrpc.result(1, {"body": f"echo {token} echo", "list": [token]}))
    assert data is not None
    assert token.encode() not in data
    assert orjson.dumps(token)[1:-1] not in data  # nor its JSON-escaped form
    assert orjson.loads(data)["result"] == {"body": "echo [REDACTED] echo", "list": ["[REDACTED]"]}


def test_short_secrets_are_redacted_too() -> None:
    wire = WireEncoder(("x7",))
    out = orjson.loads(wire.encode(jsonrpc.result(1, {"m": "a x7 b"})) or b"")
    assert out["result"]["m"] == "a [REDACTED] b"
    assert out["jsonrpc"] == "2.0"  # keys and non-string values are never touched


@given(
    secret=st.text(min_size=1, max_size=12),
    before=st.text(max_size=20),
    after=st.text(max_size=20),
)
@settings(max_examples=300, deadline=None)
def test_no_configured_secret_ever_reaches_the_wire(secret: str, before: str, after: str) -> None:
    wire = WireEncoder((secret,))
    data = wire.encode(jsonrpc.result(1, {"text": before + secret + after}))
    assert data is not None
    sentinel = next(c for c in "\x00\x01\x02" if c not in secret)
    masked = orjson.loads(data)["result"]["text"].replace("[REDACTED]", sentinel)
    assert secret not in masked


@given(
    secret=st.text(min_size=1, max_size=12),
    texts=st.lists(st.text(max_size=20), min_size=1, max_size=4),
    where=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_events_equal_encoding_each_message(secret: str, texts: list[str], where: int) -> None:
    """One secret check per chunk gives the bytes of encoding message by message."""
    wire = WireEncoder((secret,))
    messages = [jsonrpc.notification("session.update", {"delta": t}) for t in texts]
    if where < len(texts):
        messages[where]["params"]["delta"] += secret
    expected = b"".join(b"data: " + wire.encode(m) + b"\n\n" for m in messages)  # type: ignore[operator]
    assert wire.events(messages) == expected


def test_events_drop_only_a_message_that_cannot_be_encoded() -> None:
    wire = WireEncoder(("tok-123456",))
    nested: dict[str, object] = {}
    inner = nested
    for _ in range(300):  # past orjson's depth limit
        inner["x"] = {}
        inner = inner["x"]  # type: ignore[assignment]
    messages = [
        jsonrpc.notification("session.update", {"delta": "a tok-123456"}),
        jsonrpc.notification("session.update", nested),
        jsonrpc.notification("session.update", {"delta": "b"}),
    ]
    out = wire.events(messages)
    assert out.count(b"data: ") == 2 and b"tok-123456" not in out and b"[REDACTED]" in out
    assert wire.dropped == 1
