"""Sans-I/O Server-Sent Events: an encoder for our stream, a decoder for upstreams."""

from __future__ import annotations

from typing import Final

DONE: Final = b"data: [DONE]\n\n"


def encode_data(payload: bytes) -> bytes:
    """One event with a single ``data:`` line (contract.md §6)."""
    return b"data: " + payload + b"\n\n"


class SSEDecodeError(ValueError):
    pass


class SSEDecoder:
    """Incremental decoder: feed bytes, get the ``data`` of each complete event.

    Only ``data:`` fields matter to the bridge; ``event:``, ``id:``, ``retry:``
    and comments are ignored. A line longer than ``max_line`` raises
    :class:`SSEDecodeError` so a hostile upstream cannot grow our buffer.
    """

    def __init__(self, *, max_line: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._max_line = max_line

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\n" not in chunk:  # no line ends here: just keep it
            self._buf += chunk
            if len(self._buf) > self._max_line:
                raise SSEDecodeError(f"SSE line longer than {self._max_line} bytes")
            return []
        lines = (bytes(self._buf) + chunk if self._buf else chunk).split(b"\n")
        rest = lines.pop()  # after the last "\n": the start of the next line
        events: list[bytes] = []
        data = self._data
        max_line = self._max_line
        for raw in lines:
            if len(raw) > max_line:  # same verdict whether or not the "\n" came in this chunk
                raise SSEDecodeError(f"SSE line longer than {max_line} bytes")
            line = raw.rstrip(b"\r")
            if not line:
                if data:
                    events.append(b"\n".join(data))
                    data = self._data = []
                continue
            if line[0] == 0x3A:  # ":" a comment
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                data.append(value[1:] if value[:1] == b" " else value)
        self._buf = bytearray(rest)
        if len(rest) > max_line:
            raise SSEDecodeError(f"SSE line longer than {max_line} bytes")
        return events

    def flush(self) -> list[bytes]:
        """End of stream: a pending event without its blank line still counts."""
        events = self.feed(b"\n") if self._buf else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events
