"""Sans-I/O stdio framing (contract.md §14): newline JSON and ``Content-Length`` in.

Feed bytes, get back complete message bodies or :class:`FramingError` items
(each answered with ``-32700`` by the transport). Output is always one compact
JSON object per line, written by the transport. The error of a message too large
(an over-long line, or a ``Content-Length`` body past the limit: its first bytes
are waited for, the rest skipped as it arrives, never buffered) keeps its first
bytes; :func:`head_members` and :func:`head_request_id` read what they say, so
a request too large is answered by its id (``acp/codec.py``, the toolbridge and
:func:`decode_frame`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

import orjson

from xwm_bridge import jsonrpc

_HEADER = re.compile(rb"^(?:Content-Length|content-length):\s*(\d+)$")


#: the first bytes of an over-long line kept with its error (its ``id`` is there)
HEAD_BYTES = 4096


@dataclass(frozen=True, slots=True)
class FramingError:
    message: str
    #: the first bytes of a message that was too large, newline-delimited or a
    #: ``Content-Length`` body (at most ``HEAD_BYTES``, and never more than the limit
    #: + 1: the same however the input was split; fewer when the input ended first),
    #: so a transport can answer it by its id; empty otherwise
    head: bytes = b""
    #: the message was over the size limit (not malformed): counted as
    #: ``message_too_large``, answered ``-32700`` all the same
    too_large: bool = False


class _State(enum.Enum):
    LINE = enum.auto()
    HEADERS = enum.auto()
    BODY = enum.auto()
    SKIP_BODY = enum.auto()
    DISCARD_LINE = enum.auto()


class StdioDecoder:
    def __init__(self, *, max_message: int = 4 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._state = _State.LINE
        self._need = 0
        self._max = max_message
        #: state to return to once an over-long line has been discarded
        self._resume = _State.LINE
        #: a ``Content-Length`` body too large: the bytes of its head still to come
        #: before its error (then the rest is skipped as it arrives, never buffered)
        self._head_due = 0

    def feed(self, data: bytes) -> list[bytes | FramingError]:
        self._buf += data
        out: list[bytes | FramingError] = []
        while self._step(out):
            pass
        return out

    def eof(self) -> list[bytes | FramingError]:
        """End of input: a partial line is dropped (as the original), a partial body is an error."""
        out: list[bytes | FramingError] = []
        if self._state in (_State.BODY, _State.HEADERS):
            out.append(FramingError("unexpected end of input inside a Content-Length message"))
        if self._head_due:  # a body too large cut short: its error, with what came
            self._head_due = 0
            out.append(self._too_large(self._buf))
        self._buf.clear()
        self._state = _State.LINE
        return out

    def _step(self, out: list[bytes | FramingError]) -> bool:
        state = self._state
        if state in (_State.BODY, _State.SKIP_BODY):
            if self._head_due:  # SKIP_BODY: its error goes with its first bytes
                if len(self._buf) < self._head_due:
                    return False
                self._head_due = 0
                out.append(self._too_large(self._buf))
            if len(self._buf) < self._need:
                if state is _State.SKIP_BODY and self._buf:
                    self._need -= len(self._buf)
                    self._buf.clear()
                return False
            body = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            if state is _State.BODY:
                out.append(body)
            self._state = _State.LINE
            return True

        # The raw line (one trailing "\r" allowed beyond the limit) is measured the
        # same way whether or not its newline has arrived yet, so the outcome does
        # not depend on how the input was split into chunks. An over-long line is
        # an error in LINE state; an over-long extra header line is just dropped.
        line_limit = self._max + 1
        nl = self._buf.find(b"\n")
        if nl < 0:
            if len(self._buf) > line_limit and state is not _State.DISCARD_LINE:
                if state is _State.LINE:
                    out.append(self._too_large(self._buf))
                self._resume = state
                self._state = _State.DISCARD_LINE
            if self._state is _State.DISCARD_LINE:
                self._buf.clear()
            return False
        raw = bytes(self._buf[:nl])
        line = raw.strip()
        del self._buf[: nl + 1]

        if state is _State.DISCARD_LINE:
            self._state = self._resume
            return True
        if nl > line_limit:
            if state is _State.LINE:
                out.append(self._too_large(raw))
            return True
        if state is _State.HEADERS:
            if not line:
                self._state = _State.BODY if self._need <= self._max else _State.SKIP_BODY
                if self._state is _State.SKIP_BODY:  # its error once its head is in
                    self._head_due = min(HEAD_BYTES, self._max + 1)
            return True
        if not line:
            return True
        if line[:15].lower() == b"content-length:":
            m = _HEADER.match(line)
            if m is None:
                out.append(FramingError("invalid content-length header"))
                return True
            self._need = int(m.group(1))
            self._state = _State.HEADERS
            return True
        if len(line) > self._max:
            out.append(self._too_large(raw))
            return True
        out.append(line)
        return True

    def _too_large(self, raw: bytes | bytearray) -> FramingError:
        head = bytes(raw[: min(HEAD_BYTES, self._max + 1)])
        return FramingError(f"message too large: limit is {self._max} bytes", head, too_large=True)


def decode_frame(item: bytes | FramingError) -> jsonrpc.Request | dict[str, object]:
    """A decoded request, or the error envelope to answer it with (``-32700`` for bad
    framing or JSON, with id null except for a request too large whose id its first
    bytes hold: :func:`head_request_id`; ``-32600``/``-32602`` for nesting past the cap)."""
    if isinstance(item, FramingError):
        return jsonrpc.error(head_request_id(item.head), jsonrpc.PARSE_ERROR, item.message)
    try:
        return jsonrpc.decode_request(item)
    except jsonrpc.DecodeError as exc:
        return exc.envelope()


# --- a frame past the size limit, known by its first bytes ---------------------------

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_SCALAR = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_SPACE = re.compile(rb"[ \t\r\n]*")


def _skip_space(data: bytes, pos: int) -> int:
    match = _SPACE.match(data, pos)
    return match.end() if match else pos


def _skip_nested(data: bytes, pos: int) -> int | None:
    """The end of the object or array at ``pos``; None when ``data`` ends first."""
    depth = 0
    while pos < len(data):
        char = data[pos]
        if char == 0x22:  # a string: brackets in it do not count
            match = _STRING.match(data, pos)
            if match is None:
                return None
            pos = match.end()
            continue
        if char in (0x7B, 0x5B):
            depth += 1
        elif char in (0x7D, 0x5D):
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    return None


def head_members(head: bytes) -> tuple[dict[str, Any], list[str]]:
    """The top-level members at the start of a JSON object cut anywhere: the scalar
    values read whole, and the names of every member begun (in order)."""
    scalars: dict[str, Any] = {}
    names: list[str] = []
    pos = _skip_space(head, 0)
    if head[pos : pos + 1] != b"{":
        return scalars, names
    pos += 1
    while True:
        key = _STRING.match(head, _skip_space(head, pos))
        if key is None:
            break
        pos = _skip_space(head, key.end())
        if head[pos : pos + 1] != b":":
            break
        try:
            name = orjson.loads(key.group())
        except orjson.JSONDecodeError:
            break
        names.append(name)
        pos = _skip_space(head, pos + 1)
        value = _STRING.match(head, pos) or _SCALAR.match(head, pos)
        if value is not None:
            if value.end() >= len(head):
                break  # it may go on past the head: a number cut short is another number
            try:
                scalars[name] = orjson.loads(value.group())
            except orjson.JSONDecodeError:
                break
            pos = value.end()
        elif head[pos : pos + 1] in (b"{", b"["):
            end = _skip_nested(head, pos)
            if end is None:
                break
            pos = end
        else:
            break
        pos = _skip_space(head, pos)
        if head[pos : pos + 1] != b",":
            break
        pos += 1
    return scalars, names


def _head_member(scalars: dict[str, Any], names: list[str], name: str) -> tuple[bool, Any]:
    """``jsonrpc.member`` over a head: the exact name first, then the first begun whose
    lower case is ``name``; its value when read whole (else None)."""
    if name in names:
        return True, scalars.get(name)
    for begun in names:
        if begun.lower() == name:
            return True, scalars.get(begun)
    return False, None


def head_request_id(head: bytes) -> Any:
    """The id of the request a frame too large to read was, from its first bytes: a
    top-level ``id`` read whole (a string, a number or a boolean; not null, nor cut
    short) with a ``method`` member begun, names matched as :func:`jsonrpc.member`
    matches them; else None (answered with id null: the id may come after the head,
    or there may be none, and a notification cannot be told from such a request)."""
    scalars, names = head_members(head)
    has_method, _ = _head_member(scalars, names, "method")
    _, rid = _head_member(scalars, names, "id")
    return rid if has_method else None
