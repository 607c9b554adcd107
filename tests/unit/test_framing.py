"""xwm_bridge.framing.StdioDecoder (contract.md §14, examples.md §18)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge import framing, jsonrpc
from xwm_bridge.framing import FramingError, StdioDecoder, decode_frame

PROPS = settings(max_examples=200, deadline=None)

CAPS = b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}'
CLOSE = b'{"jsonrpc":"2.0","id":2,"method":"session.close","params":{"sessionId":"nope"}}'
# examples.md §18, byte for byte
EXAMPLE_18 = b"Content-Length: 52\r\n\r\n" + CAPS + CLOSE + b"\n"

Item = bytes | FramingError


def decode_all(data: bytes, *, max_message: int = 4 * 1024 * 1024) -> list[Item]:
    dec = StdioDecoder(max_message=max_message)
    return dec.feed(data) + dec.eof()


def decode_chunks(chunks: list[bytes], *, max_message: int = 4 * 1024 * 1024) -> list[Item]:
    dec = StdioDecoder(max_message=max_message)
    out: list[Item] = []
    for chunk in chunks:
        out += dec.feed(chunk)
    return out + dec.eof()


def byte_by_byte(data: bytes, **kw: int) -> list[Item]:
    return decode_chunks([data[i : i + 1] for i in range(len(data))], **kw)


def is_too_large(item: Item) -> bool:
    too_large = isinstance(item, FramingError) and "message too large" in item.message
    # the flag the transports count it by (message_too_large) says the same
    assert too_large == (isinstance(item, FramingError) and item.too_large)
    return too_large


# --- newline-delimited ----------------------------------------------------------------


def test_newline_json_messages() -> None:
    assert decode_all(b'{"a":1}\n{"b":2}\n') == [b'{"a":1}', b'{"b":2}']


def test_lines_are_trimmed_and_crlf_accepted() -> None:
    assert decode_all(b'  {"a":1}  \r\n\t{"b":2}\r\n') == [b'{"a":1}', b'{"b":2}']


def test_blank_lines_are_skipped() -> None:
    assert decode_all(b'\n\r\n   \n\t\n{"a":1}\n\n') == [b'{"a":1}']


def test_any_non_header_line_is_a_message() -> None:
    # the decoder does not parse JSON; the dispatcher answers garbage with -32700
    assert decode_all(b"not json\n") == [b"not json"]


def test_feed_returns_only_complete_lines() -> None:
    dec = StdioDecoder()
    assert dec.feed(b'{"a":') == []
    assert dec.feed(b"1}") == []
    assert dec.feed(b"\n") == [b'{"a":1}']


def test_eof_drops_a_partial_last_line() -> None:
    dec = StdioDecoder()
    assert dec.feed(b'{"a":1}\n{"b":2}') == [b'{"a":1}']
    assert dec.eof() == []


def test_eof_resets_state() -> None:
    dec = StdioDecoder()
    dec.feed(b"partial")
    assert dec.eof() == []
    assert dec.feed(b'{"x":1}\n') == [b'{"x":1}']


# --- Content-Length -------------------------------------------------------------------


def test_examples_18_stream_yields_two_messages() -> None:
    assert len(CAPS) == 52
    assert decode_all(EXAMPLE_18) == [CAPS, CLOSE]


def test_examples_18_byte_by_byte() -> None:
    assert byte_by_byte(EXAMPLE_18) == [CAPS, CLOSE]


@pytest.mark.parametrize("header", [b"Content-Length", b"content-length"])
def test_accepted_header_spellings(header: bytes) -> None:
    assert decode_all(header + b": 7\r\n\r\n" + b'{"a":1}') == [b'{"a":1}']


@pytest.mark.parametrize(
    "header",
    [b"CONTENT-LENGTH: 52", b"Content-length: 52", b"content-Length: 52", b"CoNtEnT-LeNgTh: 52"],
)
def test_other_capitalizations_are_invalid(header: bytes) -> None:
    out = decode_all(header + b"\r\n\r\n" + CAPS + b"\n")
    assert out[0] == FramingError("invalid content-length header")
    # the stream continues: the blank line is skipped, the body line is read as a line
    assert out[1:] == [CAPS]


@pytest.mark.parametrize(
    "line",
    [b"Content-Length:", b"Content-Length: abc", b"Content-Length: -1", b"content-length: 1.5"],
)
def test_unparsable_length_is_invalid(line: bytes) -> None:
    assert decode_all(line + b"\n") == [FramingError("invalid content-length header")]


def test_decoding_continues_after_invalid_header() -> None:
    out = decode_all(b"CONTENT-LENGTH: 3\n" + b'{"ok":1}\n')
    assert out == [FramingError("invalid content-length header"), b'{"ok":1}']


def test_extra_header_lines_are_discarded() -> None:
    data = (
        b"Content-Length: 7\r\n"
        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
        b"X-Whatever: yes\r\n"
        b"\r\n" + b'{"a":1}' + b'{"b":2}\n'
    )
    assert decode_all(data) == [b'{"a":1}', b'{"b":2}']


def test_body_is_exact_bytes_not_trimmed() -> None:
    body = b' {"a":1}\n '
    assert decode_all(b"Content-Length: %d\n\n" % len(body) + body) == [body]


def test_body_may_contain_newlines_and_header_like_text() -> None:
    body = b'{"a":\n"Content-Length: 3"}'
    out = decode_all(b"content-length: %d\n\n" % len(body) + body + b'\n{"z":0}\n')
    assert out == [body, b'{"z":0}']


def test_zero_length_body() -> None:
    assert decode_all(b"Content-Length: 0\n\n" + b'{"a":1}\n') == [b"", b'{"a":1}']


def test_consecutive_framed_messages() -> None:
    data = b"".join(b"Content-Length: %d\r\n\r\n%s" % (len(m), m) for m in (CAPS, CLOSE))
    assert decode_all(data) == [CAPS, CLOSE]


def test_header_without_space_and_leading_zeros() -> None:
    assert decode_all(b"Content-Length:007\n\n" + b'{"a":1}') == [b'{"a":1}']


def test_eof_inside_body_is_reported() -> None:
    dec = StdioDecoder()
    assert dec.feed(b"Content-Length: 52\r\n\r\n" + CAPS[:10]) == []
    out = dec.eof()
    assert len(out) == 1
    assert isinstance(out[0], FramingError)
    assert "end of input" in out[0].message


def test_eof_inside_headers_is_reported() -> None:
    dec = StdioDecoder()
    assert dec.feed(b"Content-Length: 52\r\nX-Other: 1\r\n") == []
    out = dec.eof()
    assert len(out) == 1 and isinstance(out[0], FramingError)


# --- size limits ----------------------------------------------------------------------


def test_oversized_line_is_an_error_and_decoding_continues() -> None:
    out = decode_all(b"x" * 100 + b'\n{"a":1}\n', max_message=64)
    assert len(out) == 2
    assert is_too_large(out[0])
    assert isinstance(out[0], FramingError) and "64" in out[0].message
    assert out[1] == b'{"a":1}'


def test_oversized_line_without_newline_yet_is_reported_once() -> None:
    dec = StdioDecoder(max_message=64)
    out: list[Item] = []
    for _ in range(10):
        out += dec.feed(b"y" * 50)
    assert len(out) == 1 and is_too_large(out[0])
    assert dec.feed(b'tail\n{"a":1}\n') == [b'{"a":1}']
    assert dec.eof() == []


def test_line_at_exact_limit_is_accepted_with_crlf() -> None:
    line = b"z" * 64
    assert decode_all(line + b"\r\n", max_message=64) == [line]
    assert byte_by_byte(line + b"\r\n", max_message=64) == [line]


def test_line_one_over_limit_is_rejected() -> None:
    out = decode_all(b"z" * 65 + b"\n", max_message=64)
    assert len(out) == 1 and is_too_large(out[0])


def test_oversized_body_is_an_error_and_decoding_continues() -> None:
    body = b"b" * 100
    out = decode_all(b"Content-Length: 100\r\n\r\n" + body + b'{"a":1}\n', max_message=64)
    assert len(out) == 2
    assert is_too_large(out[0])
    assert out[1] == b'{"a":1}'


def test_oversized_body_skipped_across_chunks() -> None:
    dec = StdioDecoder(max_message=64)
    assert dec.feed(b"Content-Length: 1000\n\n") == []  # its error waits for its head
    (error,) = dec.feed(b"q" * 100)  # the limit + 1 bytes are in: the error, with them
    assert is_too_large(error) and isinstance(error, FramingError) and error.head == b"q" * 65
    for _ in range(8):
        assert dec.feed(b"q" * 100) == []
    assert dec.feed(b"q" * 100 + b'{"after":1}\n') == [b'{"after":1}']


def test_a_content_length_body_too_large_keeps_its_head_and_buffers_no_more() -> None:
    """It was refused unread, its error with id null: the client waited for its id."""
    limit = 8192
    body = b'{"jsonrpc":"2.0","id":"big-1","method":"session.message","params":{"p":"'
    body += b"x" * (limit + (1 << 20) - len(body) - 3) + b'"}}'
    data = b"Content-Length: %d\r\n\r\n" % len(body) + body + b'{"id":2}\n'
    dec = StdioDecoder(max_message=limit)
    out: list[Item] = []
    for i in range(0, len(data), 1000):
        out += dec.feed(data[i : i + 1000])
        assert len(dec._buf) <= framing.HEAD_BYTES + 1000  # never the whole body
    error, after = out
    assert isinstance(error, FramingError) and error.head == body[: framing.HEAD_BYTES]
    assert error.message == f"message too large: limit is {limit} bytes"
    assert framing.head_request_id(error.head) == "big-1"
    reply = decode_frame(error)
    assert isinstance(reply, dict) and reply["id"] == "big-1"
    assert after == b'{"id":2}'
    assert decode_all(data, max_message=limit) == out
    assert byte_by_byte(data[:6000], max_message=limit) == [error]


def test_a_content_length_body_too_large_cut_short_by_eof_keeps_what_came() -> None:
    dec = StdioDecoder(max_message=64)
    assert dec.feed(b'Content-Length: 500\n\n{"id":3,"method":"m"') == []
    (error,) = dec.eof()
    assert isinstance(error, FramingError) and error.head == b'{"id":3,"method":"m"'
    assert framing.head_request_id(error.head) == 3
    assert dec.feed(b'{"a":1}\n') == [b'{"a":1}']  # and the decoder starts afresh


def test_body_at_exact_limit_is_accepted() -> None:
    body = b"c" * 64
    assert decode_all(b"Content-Length: 64\n\n" + body, max_message=64) == [body]


def test_oversized_extra_header_line_is_discarded_silently() -> None:
    data = b"Content-Length: 7\n" + b"X-Long: " + b"h" * 200 + b"\n\n" + b'{"a":1}'
    assert decode_all(data, max_message=64) == [b'{"a":1}']
    assert byte_by_byte(data, max_message=64) == [b'{"a":1}']


# --- properties -----------------------------------------------------------------------

messages = st.lists(st.binary(max_size=40), max_size=6)


def _needs_framing(msg: bytes) -> bool:
    """A message that cannot travel as one newline-terminated line."""
    return b"\n" in msg or not msg.strip() or msg.strip().lower().startswith(b"content-length:")


def _encode(msgs: list[bytes], framed_flags: list[bool]) -> bytes:
    out = b""
    for msg, framed in zip(msgs, framed_flags, strict=False):
        if framed or _needs_framing(msg):
            out += b"Content-Length: %d\r\n\r\n" % len(msg) + msg
        else:
            out += msg + b"\n"
    return out


@PROPS
@given(messages, st.lists(st.booleans(), min_size=6, max_size=6))
def test_mixed_framing_roundtrip(msgs: list[bytes], framed: list[bool]) -> None:
    data = _encode(msgs, framed)
    expected = [
        m if (f or _needs_framing(m)) else m.strip() for m, f in zip(msgs, framed, strict=False)
    ]
    assert decode_all(data) == expected
    assert byte_by_byte(data) == expected


stream_pieces = st.lists(
    st.sampled_from(
        [
            b"\n",
            b"\r\n",
            b"  ",
            b'{"a":1}',
            b"Content-Length: 5",
            b"content-length: 12",
            b"CONTENT-LENGTH: 3",
            b"Content-Length: 200",
            b"X-Header: v",
            b"x" * 70,
            b"y" * 64,
            b"abc",
        ]
    )
    | st.binary(max_size=12),
    max_size=25,
)


@PROPS
@given(stream_pieces, st.data())
def test_split_invariance(pieces: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    whole = decode_all(stream, max_message=64)
    assert decode_chunks(chunks, max_message=64) == whole
    assert byte_by_byte(stream, max_message=64) == whole


@PROPS
@given(st.lists(st.binary(max_size=64), max_size=10))
def test_random_bytes_never_raise(chunks: list[bytes]) -> None:
    out = decode_chunks(chunks, max_message=32)
    for item in out:
        assert isinstance(item, (bytes, FramingError))
        if isinstance(item, bytes):
            assert len(item) <= 32


def test_frames_nested_past_the_cap_get_an_error_envelope() -> None:
    """issue 16 item 3: acp-stdio and the toolbridge answer such a frame, by its id when
    the id is readable, instead of failing in the writer."""
    from tests.nesting import nested_json

    deep_id = f'{{"id":{nested_json(300)},"method":"m"}}'.encode()
    deep_params = f'{{"id":"r1","method":"m","params":{{"a":{nested_json(300)}}}}}'.encode()
    assert decode_frame(deep_id)["error"]["code"] == -32600  # type: ignore[index]
    reply = decode_frame(deep_params)
    assert isinstance(reply, dict)
    assert reply["id"] == "r1" and reply["error"]["code"] == -32602


def test_a_line_too_large_keeps_its_head_however_it_was_split() -> None:
    # the first bytes (here the limit + 1) go with the error: a transport reads the id
    line = b'{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"x":"' + b"a" * 200
    for out in (decode_all(line + b"\n", max_message=64), byte_by_byte(line, max_message=64)):
        (item,) = out
        assert is_too_large(item) and isinstance(item, FramingError)
        assert item.head == line[:65]
    (big,) = decode_all(b"  " + b"b" * 10_000 + b"\n", max_message=8192)
    assert isinstance(big, FramingError) and len(big.head) == 4096  # at most HEAD_BYTES
    framed = decode_all(b"Content-Length: 99\r\n\r\n" + line[:99], max_message=64)
    assert framed == [FramingError("message too large: limit is 64 bytes", line[:65], True)]


@pytest.mark.parametrize(
    ("head", "scalars", "names"),
    [
        (b'{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"p":"aa', None, None),
        (b' { "id" : "a\\"b" , "result" : {"content":"xx', {"id": 'a"b'}, ["id", "result"]),
        (b'{"method":"x","params":{"a":[1,{"b":"}]"}]},"id":12,', None, None),
        (b'{"method":"x","params":{"a":[1,{"b":"}]"}]},"id":12', {"method": "x"}, None),
        (b'{"id":12', {}, ["id"]),  # a number cut short is not read
        (b"[1,2", {}, []),
        (b"", {}, []),
    ],
)
def test_head_members_reads_the_top_level_of_a_cut_frame(
    head: bytes, scalars: dict[str, object] | None, names: list[str] | None
) -> None:
    got_scalars, got_names = framing.head_members(head)
    if scalars is not None:
        assert got_scalars == scalars
    if names is not None:
        assert got_names == names
    if head.startswith(b'{"jsonrpc"'):
        assert got_scalars == {"jsonrpc": "2.0", "id": 3, "method": "session/prompt"}
        assert got_names == ["jsonrpc", "id", "method", "params"]
    if head.endswith(b"12,"):
        assert got_scalars == {"method": "x", "id": 12}  # nested brackets in strings skipped


@pytest.mark.parametrize(
    ("head", "rid"),
    [
        (b'{"jsonrpc":"2.0","id":"r1","method":"session.start","params":{"taskPrompt":"', "r1"),
        (b'{"method":"session.start","id":2.5,"params":{', 2.5),
        (b'{"ID":4,"Method":"x","params":{', 4),  # names matched as jsonrpc.member does
        (b'{"id":true,"method":"x","params":{', True),  # the contract echoes any id
        (b'{"jsonrpc":"2.0","method":"session.start","params":{"a":"', None),  # id later?
        (b'{"jsonrpc":"2.0","id":null,"method":"x","params":{', None),  # a notification
        (b'{"jsonrpc":"2.0","id":7,"params":{"a":"', None),  # no method begun yet
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"x","params":{', None),  # not read whole
        (b'{"id":12', None),  # cut short
        (b"[1,2", None),
        (b"", None),
    ],
)
def test_head_request_id_reads_the_id_of_a_request_from_its_first_bytes(
    head: bytes, rid: object
) -> None:
    assert framing.head_request_id(head) == rid
    message = "message too large: limit is 64 bytes"
    reply = decode_frame(FramingError(message, head))
    assert reply == jsonrpc.error(rid, jsonrpc.PARSE_ERROR, message)
