"""Sans-I/O timing of one streamed turn: an SSE answer fed to a timer as it arrives.

The load generator feeds each piece of the response body with the clock reading
at which it arrived; the timer decodes the events (``xwm_bridge.sse``), counts
the notifications and records, relative to the request's start:

* ``first_event``: the first ``data:`` event of any kind (on the bridge that is
  its own ``status``/``started`` update, sent before the upstream answers);
* ``first_delta``: the first ``session.update`` of type ``delta``, i.e. the
  first chunk of output (on the bridge: the first relayed upstream frame);
* ``result_at``: the final JSON-RPC response (result or error).

:func:`stream_prompt` builds a prompt that the fake upstream
(``internal.peers.fake_acp``) splits into exactly ``chunks`` pieces.
"""

from __future__ import annotations

from typing import Any

import orjson

from xwm_bridge.sse import SSEDecodeError, SSEDecoder

#: what the fake upstream puts in front of the prompt to make its output
ECHO_PREFIX = "echo: "
_FILLER = "the quick brown fox jumps over the lazy dog; "
#: a turn's whole SSE body stays far below this; a longer line is a broken stream
MAX_LINE = 1024 * 1024


def stream_prompt(chunks: int, piece: int = 20) -> str:
    """A prompt whose echo (``"echo: " + prompt``) is ``chunks * piece`` characters.

    The fake cuts its output into pieces of ``ceil(len(output) / chunks)``
    characters, so this output gives exactly ``chunks`` pieces of ``piece``.
    """
    size = chunks * piece - len(ECHO_PREFIX)
    if chunks < 1 or piece < 1 or size < 1:
        raise ValueError(f"no prompt makes {chunks} pieces of {piece} characters")
    text = _FILLER * (size // len(_FILLER) + 1)
    return text[:size]


class StreamTimer:
    """Decodes one SSE answer and times its events (seconds after ``started``)."""

    __slots__ = (
        "_decoder",
        "deltas",
        "envelope",
        "first_delta",
        "first_event",
        "notifications",
        "problem",
        "result_at",
        "started",
    )

    def __init__(self, started: float) -> None:
        self.started = started
        self.first_event: float | None = None
        self.first_delta: float | None = None
        self.result_at: float | None = None
        self.notifications = 0
        self.deltas = 0
        self.envelope: dict[str, Any] | None = None
        self.problem = ""
        self._decoder = SSEDecoder(max_line=MAX_LINE)

    def feed(self, chunk: bytes, now: float) -> None:
        """A piece of the body, read at clock reading ``now``."""
        if self.problem:
            return
        try:
            events = self._decoder.feed(chunk)
        except SSEDecodeError as exc:
            self.problem = str(exc)
            return
        for data in events:
            self._event(data, now)

    def close(self, now: float) -> None:
        """The body ended (an event without its closing blank line still counts)."""
        if not self.problem:
            for data in self._decoder.flush():
                self._event(data, now)

    def _event(self, data: bytes, now: float) -> None:
        if self.problem:
            return
        if self.first_event is None:
            self.first_event = now - self.started
        if self.envelope is not None:
            self.problem = f"event after the result: {data[:120]!r}"
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.problem = f"event is not JSON: {data[:120]!r}"
            return
        if not isinstance(obj, dict):
            self.problem = f"event is not a JSON-RPC object: {data[:120]!r}"
            return
        if "method" in obj and "id" not in obj:
            self.notifications += 1
            params = obj.get("params")
            if (
                obj["method"] == "session.update"
                and isinstance(params, dict)
                and params.get("type") == "delta"
            ):
                self.deltas += 1
                if self.first_delta is None:
                    self.first_delta = now - self.started
            return
        self.envelope = obj
        self.result_at = now - self.started

    def verdict(self, expected_deltas: int) -> str:
        """'' for a successful turn with ``expected_deltas`` deltas (0: any), else why not."""
        if self.problem:
            return self.problem
        if self.envelope is None:
            return f"stream ended without a result ({self.notifications} notifications)"
        result = self.envelope.get("result")
        if not isinstance(result, dict) or result.get("success") is not True:
            return f"turn failed: {orjson.dumps(self.envelope)[:300]!r}"
        if expected_deltas and self.deltas != expected_deltas:
            return f"{self.deltas} delta notifications, expected {expected_deltas}"
        return ""
