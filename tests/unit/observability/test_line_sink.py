"""``LineSink`` (observability/line_sink.py): lines leave in order from its thread; a
warning is written through before ``put_now`` returns, but a stderr that takes nothing
(its reader stalled: journald, a container runtime's log pipe) never stalls the caller,
the event loop, for more than ``WRITE_THROUGH_WAIT``."""

from __future__ import annotations

import logging
import threading

import pytest

from xwm_bridge.observability import line_sink
from xwm_bridge.observability import logging as obslog
from xwm_bridge.observability.line_sink import LineSink


class Wedged:
    """A write that blocks until released (a full pipe nobody reads)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.written: list[bytes] = []

    def __call__(self, data: bytes) -> None:
        self.entered.set()
        self.release.wait()
        self.written.append(data)


def test_a_warning_is_written_before_put_now_returns() -> None:
    written: list[bytes] = []
    sink = LineSink(written.append, flush_interval=60)  # the thread would wait a minute
    try:
        sink.put(b"info\n")
        sink.put_now(b"warning\n")
        assert b"".join(written) == b"info\nwarning\n"  # in order, the info line first
    finally:
        sink.close()


def test_a_wedged_stderr_does_not_block_put_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(line_sink, "WRITE_THROUGH_WAIT", 0.05)
    wedged = Wedged()
    sink = LineSink(wedged, flush_interval=0)
    sink.put(b"first\n")
    assert wedged.entered.wait(10)  # the writer thread is stuck in write(2)
    returned: list[int] = []

    def warn() -> None:
        for n in range(3):
            sink.put_now(b"warning %d\n" % n)
            returned.append(n)

    caller = threading.Thread(target=warn, daemon=True)  # the event loop's thread
    caller.start()
    caller.join(5)  # a bound for the failure only: it returns in about 0.05 s
    try:
        assert returned == [0, 1, 2]  # it did not wait for the write
    finally:
        wedged.release.set()
        caller.join(10)
    sink.close()
    # nothing was lost: once stderr takes data again every line goes, in order
    assert b"".join(wedged.written) == b"first\nwarning 0\nwarning 1\nwarning 2\n"


def test_warnings_queued_behind_a_wedged_stderr_are_capped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(line_sink, "WRITE_THROUGH_WAIT", 0.05)
    wedged = Wedged()
    sink = LineSink(wedged, flush_interval=0, max_pending=4)
    sink.put(b"first\n")
    assert wedged.entered.wait(10)
    for n in range(10):
        sink.put_now(b"w%d\n" % n)
    wedged.release.set()
    sink.close()
    # the queue holds at most max_pending entries (a line and its wait marker): memory
    # stays bounded however long stderr takes nothing; the rest are counted
    assert b"".join(wedged.written) == b"first\nw0\nw1\n"
    assert sink.dropped == 8


def test_dropped_lines_are_a_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines the sink could not write (stderr refused them, or the queue was full) are
    the one failure the log cannot tell: /metrics does."""
    from xwm_bridge.observability.metrics import Metrics

    def refuse(data: bytes) -> None:
        raise OSError("EPIPE")

    sink = LineSink(refuse, flush_interval=0)
    monkeypatch.setattr(obslog, "_sink", sink)
    try:
        sink.put(b"a\n")
        sink.put(b"b\n")
        sink.flush()
        assert sink.dropped == 2
        text = Metrics().render().decode()
    finally:
        sink.close()
    assert "xwm_log_lines_dropped_total 2.0" in text.splitlines()


def test_close_gives_up_on_a_wedged_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """``close`` (and the exit hook) wrote the last lines on the caller's thread, after
    the writer thread's lock: with stderr wedged (a full pipe nobody reads) the process
    never exited. Now it waits ``CLOSE_WAIT`` for the writer thread, then gives up."""
    monkeypatch.setattr(line_sink, "CLOSE_WAIT", 0.1)
    wedged = Wedged()
    sink = LineSink(wedged, flush_interval=0)
    sink.put(b"first\n")
    assert wedged.entered.wait(10)  # the writer thread is stuck in write(2)
    sink.put(b"second\n")
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(sink.close()), daemon=True)
    closer.start()
    closer.join(5)  # a bound for the failure only: it returns in about 0.1 s
    try:
        assert closed == [False]  # returned, and said the lines were not all written
    finally:
        wedged.release.set()
        closer.join(10)


def test_close_writes_every_queued_line_from_the_writer_thread() -> None:
    written: list[bytes] = []
    sink = LineSink(written.append, flush_interval=60)
    sink.put(b"a\n")
    sink.put(b"b\n")
    assert sink.close() is True
    assert b"".join(written) == b"a\nb\n"


def test_the_exit_hook_is_the_bounded_close(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks: list[object] = []
    monkeypatch.setattr(obslog.atexit, "register", hooks.append)
    try:
        sink = obslog.setup_logging("info", (), write=lambda data: None)
        assert hooks == [sink.close]
    finally:  # as test_logging's setup test leaves it
        logging.getLogger().handlers[:] = []
        obslog.events.configure(None, obslog.Redactor(), logging.INFO)


def test_flush_logs_before_a_forced_exit_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third signal logs "exiting now", flushes and ``os._exit``s: the flush wrote on
    the caller's thread after the writer thread's lock, so with stderr wedged the
    operator's third signal never ended the process."""
    wedged = Wedged()
    sink = LineSink(wedged, flush_interval=0)
    monkeypatch.setattr(obslog, "_sink", sink)
    sink.put(b"first\n")
    assert wedged.entered.wait(10)
    sink.put(b"exiting now\n")
    done: list[bool] = []
    flusher = threading.Thread(target=lambda: done.append(obslog.flush_logs(0.1)), daemon=True)
    flusher.start()
    flusher.join(5)  # a bound for the failure only: it returns in about 0.1 s
    try:
        assert done == [False]
    finally:
        wedged.release.set()
        flusher.join(10)
    assert obslog.flush_logs(5) is True  # stderr takes data again: every line goes
    assert b"".join(wedged.written) == b"first\nexiting now\n"
    sink.close()
