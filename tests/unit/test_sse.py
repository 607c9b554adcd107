"""xwm_bridge.sse: the SSE encoder for our stream and the decoder for upstreams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge import sse
from xwm_bridge.sse import SSEDecodeError, SSEDecoder

PROPS = settings(max_examples=200, deadline=None)


def decode(data: bytes, *, max_line: int = 1 << 20) -> list[bytes]:
    dec = SSEDecoder(max_line=max_line)
    return dec.feed(data) + dec.flush()


def decode_chunks(chunks: list[bytes], *, max_line: int = 1 << 20) -> list[bytes]:
    dec = SSEDecoder(max_line=max_line)
    out: list[bytes] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    return out + dec.flush()


# --- encoder --------------------------------------------------------------------------


def test_encode_data_format() -> None:
    assert sse.encode_data(b'{"a":1}') == b'data: {"a":1}\n\n'
    assert sse.encode_data(b"") == b"data: \n\n"


def test_done_sentinel() -> None:
    assert sse.DONE == b"data: [DONE]\n\n"


def test_encode_decode_roundtrip() -> None:
    payloads = [b'{"jsonrpc":"2.0"}', b"[DONE]", b"x y z"]
    stream = b"".join(sse.encode_data(p) for p in payloads)
    assert decode(stream) == payloads


# --- decoder --------------------------------------------------------------------------


def test_single_event() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: hello\n") == []
    assert dec.feed(b"\n") == [b"hello"]


def test_multi_line_data_joined_with_newline() -> None:
    assert decode(b"data: a\ndata: b\ndata:c\n\n") == [b"a\nb\nc"]


def test_only_one_leading_space_is_removed() -> None:
    assert decode(b"data:  two spaces\n\ndata:none\n\n") == [b" two spaces", b"none"]


def test_data_without_colon_is_an_empty_line_of_data() -> None:
    assert decode(b"data\n\n") == [b""]
    assert decode(b"data: x\ndata\n\n") == [b"x\n"]


def test_comments_event_id_retry_are_ignored() -> None:
    stream = (
        b": keep-alive comment\n"
        b"event: message\n"
        b"id: 42\n"
        b"retry: 1000\n"
        b"data: payload\n"
        b"unknown-field: ignored\n"
        b"\n"
    )
    assert decode(stream) == [b"payload"]


def test_event_without_data_produces_nothing() -> None:
    assert decode(b"event: ping\nid: 1\n\n: comment\n\n") == []


def test_blank_lines_between_events() -> None:
    assert decode(b"\n\n\ndata: a\n\n\n\ndata: b\n\n") == [b"a", b"b"]


def test_crlf_line_endings() -> None:
    assert decode(b"data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n") == [b"a\nb", b"c"]


def test_mixed_line_endings() -> None:
    assert decode(b"data: a\r\n\ndata: b\n\r\n") == [b"a", b"b"]


def test_field_name_is_case_sensitive() -> None:
    assert decode(b"Data: x\nDATA: y\n\n") == []


def test_data_value_may_contain_colons() -> None:
    assert decode(b'data: {"a":"b:c"}\n\n') == [b'{"a":"b:c"}']


def test_flush_emits_trailing_event_without_blank_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: first\n\ndata: last\n") == [b"first"]
    assert dec.flush() == [b"last"]


def test_flush_emits_trailing_unterminated_line() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: partial") == []
    assert dec.flush() == [b"partial"]


def test_flush_with_nothing_pending() -> None:
    dec = SSEDecoder()
    assert dec.feed(b"data: x\n\n") == [b"x"]
    assert dec.flush() == []
    assert SSEDecoder().flush() == []


def test_flush_ignores_trailing_comment() -> None:
    dec = SSEDecoder()
    dec.feed(b": just a comment")
    assert dec.flush() == []


def test_flush_is_idempotent() -> None:
    dec = SSEDecoder()
    dec.feed(b"data: x")
    assert dec.flush() == [b"x"]
    assert dec.flush() == []


# --- line limit -----------------------------------------------------------------------


def test_over_long_partial_line_raises() -> None:
    dec = SSEDecoder(max_line=16)
    dec.feed(b"data: 0123456789")
    with pytest.raises(SSEDecodeError, match="16"):
        dec.feed(b"abcdef")


def test_over_long_complete_line_raises_too() -> None:
    with pytest.raises(SSEDecodeError):
        SSEDecoder(max_line=16).feed(b"data: " + b"x" * 40 + b"\n\n")


def test_line_at_limit_is_fine() -> None:
    # the limit counts the raw line without its "\n" (a "\r" counts)
    line = b"data: " + b"x" * 10  # 16 bytes
    assert decode(line + b"\n\n", max_line=16) == [b"x" * 10]
    assert decode_chunks([line, b"\n", b"\n"], max_line=16) == [b"x" * 10]
    assert decode(line[:-1] + b"\r\n\r\n", max_line=16) == [b"x" * 9]


def test_many_short_lines_do_not_trip_the_limit() -> None:
    stream = b"".join(b"data: %d\n" % i for i in range(100)) + b"\n"
    out = decode(stream, max_line=16)
    assert out == [b"\n".join(b"%d" % i for i in range(100))]


def test_decode_error_is_a_value_error() -> None:
    assert issubclass(SSEDecodeError, ValueError)


# --- properties -----------------------------------------------------------------------

payloads = st.lists(
    st.binary(max_size=30).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=5
)
events = st.lists(payloads.filter(bool), max_size=6)


def _render(evs: list[list[bytes]], crlf: bool) -> bytes:
    eol = b"\r\n" if crlf else b"\n"
    out = b""
    for ev in evs:
        out += b": comment" + eol
        for line in ev:
            out += b"data: " + line + eol
        out += b"event: x" + eol + eol
    return out


@PROPS
@given(events, st.booleans(), st.data())
def test_chunk_split_invariance(evs: list[list[bytes]], crlf: bool, data: st.DataObject) -> None:
    stream = _render(evs, crlf)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    expected = [b"\n".join(ev) for ev in evs]
    assert decode(stream) == expected
    assert decode_chunks(chunks) == expected
    assert decode_chunks([stream[i : i + 1] for i in range(len(stream))]) == expected


sse_pieces = st.lists(
    st.sampled_from(
        [b"\n", b"\r\n", b"data: ", b"data:", b": c", b"id: 1", b"x" * 20, b"y" * 40, b"\r"]
    )
    | st.binary(max_size=10),
    max_size=30,
)


@PROPS
@given(sse_pieces, st.data())
def test_arbitrary_bytes_split_invariance(pieces: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    def run(parts: list[bytes]) -> list[bytes] | str:
        try:
            return decode_chunks(parts, max_line=32)
        except SSEDecodeError:
            return "too long"

    assert run(chunks) == run([stream])
