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
        self._buf += chunk
        events: list[bytes] = []
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self._max_line:
                    raise SSEDecodeError(f"SSE line longer than {self._max_line} bytes")
                return events
            if nl > self._max_line:  # same verdict whether or not the "\n" came in this chunk
                raise SSEDecodeError(f"SSE line longer than {self._max_line} bytes")
            line = bytes(self._buf[:nl]).rstrip(b"\r")
            del self._buf[: nl + 1]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)

    def flush(self) -> list[bytes]:
        """End of stream: a pending event without its blank line still counts."""
        events = self.feed(b"\n") if self._buf else []
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
        return events
