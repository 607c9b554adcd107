"""internal.bench.front_path: the in-process driver of the /acp/rpc front path."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from internal.bench import front_path
from xwm_bridge.observability import logging as obslog


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """measure() sets up the process's logging as the daemon does: put it back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    events = obslog.events
    saved = (events._sink, events._redactor, events.level, events.text, obslog._sink)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        events.configure(saved[0], saved[1], saved[2], text=saved[3])
        obslog._sink = saved[4]


def test_the_bench_request_is_the_raw_client_s() -> None:
    raw = front_path.request_bytes(b"{}")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert body == b"{}" and head.startswith(b"POST /acp/rpc HTTP/1.1\r\n")
    names = [line.split(b":")[0] for line in head.split(b"\r\n")[1:]]
    assert names == [b"Host", b"Content-Type", b"Accept", b"Authorization", b"Content-Length"]


@pytest.mark.usefixtures("restored_logging")
async def test_measures_answered_requests_with_one_audit_line_each() -> None:
    result = await front_path.measure(40, conns=2, calls=True)
    assert result["method"] == "acp.capabilities" and result["requests"] == 40
    assert result["log_lines"] == 40  # the audit line of each, rendered and written
    assert result["thread_us"] > 0 and result["process_us"] > 0 and result["calls"] > 50
