"""Hypothesis strategies for the decoder fuzz (issue 16): what a hostile or unlucky peer
may send. Valid and broken JSON-RPC envelopes, nesting from 0 to past orjson's 1024-level
read limit, strings up to a given size cap, odd ids, and plain garbage."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import strategies as st

from tests.nesting import nested_json

METHODS = [
    "acp.capabilities",
    "session.start",
    "session.message",
    "session.cancel",
    "session.close",
    "session.replay",
    "session.permission",
    "xworkmate.routing.resolve",
    "xworkmate.dispatch.resolve",
    "xworkmate.mounts.reconcile",
    "xworkmate.gateway.request",
    "xworkmate.gateway.disconnect",
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "no.such.method",
    "",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", " ", "\0", "/tmp/\0x", "../../etc/passwd", "9" * 25, "é" * 5]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _text_of(value: Any) -> str:
    return orjson.dumps(value).decode()


@st.composite
def deep(draw: st.DrawFn) -> str:
    """A JSON value nested 0-1100 levels (past 1024, orjson refuses to read it)."""
    depth = draw(st.one_of(st.integers(0, 80), st.integers(250, 300), st.integers(1000, 1100)))
    return nested_json(depth)


@st.composite
def big_string(draw: st.DrawFn, cap: int) -> str:
    """A JSON string of up to ``cap`` bytes (built, not drawn byte by byte)."""
    size = draw(st.one_of(st.integers(0, 64), st.integers(max(cap - 512, 0), cap + 512)))
    return _text_of("x" * max(size - 2, 0))


@st.composite
def params_text(draw: st.DrawFn, cap: int) -> str:
    keys = [
        "sessionId", "threadId", "taskPrompt", "workingDirectory", "afterSeq", "limit",
        "routing", "runtimeId", "name", "arguments", "codexHome", "requestId", "optionId",
    ]  # fmt: skip
    members = []
    for key in draw(st.lists(st.sampled_from(keys), max_size=5, unique=True)):
        value = draw(
            st.one_of(
                json_values.map(_text_of),
                deep(),
                big_string(cap // 4),
                st.just('{"routingMode":"explicit","explicitExecutionTarget":"singleAgent"}'),
            )
        )
        members.append(f"{_text_of(key)}:{value}")
    return "{" + ",".join(members) + "}"


@st.composite
def request_text(draw: st.DrawFn, rid: int, cap: int) -> bytes:
    """One frame that must get exactly one reply: it always carries an id, unless it is
    not a JSON object at all (then the reply is an error with id null)."""
    kind = draw(st.sampled_from(["request", "request", "request", "garbage", "not-object"]))
    if kind == "garbage":
        raw = draw(st.binary(min_size=1, max_size=200))
        raw = raw.replace(b"\n", b" ").replace(b"\r", b" ").strip() or b"?"
        if raw.lower().startswith(b"content-length"):
            raw = b"x" + raw
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        if isinstance(obj, dict):  # a valid object would need an id to be answered
            return b"[" + raw + b"]"
        return raw
    if kind == "not-object":
        return draw(st.sampled_from([b"[]", b"1", b'"x"', b"null", b"[1,2]", b"true"]))
    method = draw(st.sampled_from(METHODS))
    rid_text = draw(st.one_of(st.just(str(rid)), st.just(_text_of(f"r{rid}")), deep()))
    params = draw(st.one_of(params_text(cap), st.just("[1]"), st.just("null"), deep()))
    members = ['"jsonrpc":"2.0"', f'"id":{rid_text}', f'"method":{_text_of(method)}']
    if draw(st.booleans()):
        members.append(f'"params":{params}')
    return ("{" + ",".join(members) + "}").encode()
