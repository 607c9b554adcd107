"""The sink every log line of the process goes through: finished lines written to a file
descriptor (stderr) in order, in batches, from its own thread, so the event loop never
blocks on ``write(2)``.

A warning is written through before :meth:`LineSink.put_now` returns (with every line
queued before it), waited for at most :data:`WRITE_THROUGH_WAIT`: a stderr that takes
nothing (its reader stalled: journald, a container runtime's log pipe) must not stall
the event loop with it. At most ``max_pending`` lines wait; past that they are counted
as dropped. :meth:`LineSink.close` (the exit hook) and :meth:`LineSink.sync` are bounded
too, so such a stderr never holds the process's exit.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

#: how long a warning waits for the writer thread to have written it; past that the
#: sink is taken as stalled and later warnings do not wait until a write goes through
WRITE_THROUGH_WAIT = 0.5
#: how long :meth:`LineSink.close` (the exit hook) waits for the writer thread to write
#: the lines still queued: a stderr that takes nothing must not hold the process's exit
CLOSE_WAIT = 2.0


class LineSink:
    """Ordered, batched writes of finished lines to a file descriptor from a thread."""

    def __init__(
        self,
        write: Callable[[bytes], None] | None = None,
        *,
        flush_interval: float = 0.02,
        max_pending: int = 65536,
    ) -> None:
        self._write = write or _fd_writer(2)
        self._interval = flush_interval
        self._max_pending = max_pending
        #: lines, and the events of warnings waiting for the lines before them
        self._lines: deque[bytes | threading.Event] = deque()
        self._lock = threading.Lock()  # one writer at a time: the thread, or a flush
        self._wake = threading.Event()
        #: a warning is queued: the thread writes without letting a batch gather
        self._hurry = threading.Event()
        #: a warning's wait timed out: stderr takes nothing (cleared by a write)
        self._stalled = False
        self._closed = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def put(self, line: bytes) -> None:
        if len(self._lines) >= self._max_pending:
            self.dropped += 1  # a wedged stderr must not grow memory without bound
            return
        self._lines.append(line)
        # no lost wake-up: the writer clears the event before it drains the queue
        if not self._wake.is_set():
            self._wake.set()

    def put_now(self, line: bytes) -> None:
        """Write ``line`` (and every line queued before it) before returning; when
        stderr takes nothing, return after :data:`WRITE_THROUGH_WAIT` (at once while
        it stays stalled) and leave the line queued, in order."""
        if self._closed:  # no thread any more
            self._lines.append(line)
            self.flush()
            return
        if len(self._lines) >= self._max_pending:
            self.dropped += 1  # stalled long enough to fill the queue: the cap holds
            return
        written = threading.Event()
        self._lines.append(line)
        self._lines.append(written)
        self._hurry.set()
        self._wake.set()
        if not self._stalled and not written.wait(WRITE_THROUGH_WAIT):
            self._stalled = True

    def flush(self) -> None:
        with self._lock:
            self._drain()

    def sync(self, timeout: float) -> bool:
        """Until the writer thread has written every line queued so far, at most
        ``timeout`` seconds (a wedged stderr must not hold the caller: the last words
        before an exit); whether they were written."""
        if self._closed:  # no thread any more: nothing writes them
            return not self._lines
        written = threading.Event()
        self._lines.append(written)
        self._hurry.set()
        self._wake.set()
        return written.wait(timeout)

    def _drain(self) -> None:
        lines = self._lines
        batch: list[bytes] = []
        waiting: list[threading.Event] = []
        while lines:
            item = lines.popleft()
            if isinstance(item, bytes):
                batch.append(item)
            else:
                waiting.append(item)
        try:
            if batch:
                self._write(b"".join(batch))
                self._stalled = False
        except OSError:
            self.dropped += len(batch)
        finally:
            for written in waiting:
                written.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            # let a batch gather (one write(2) for many lines), unless a warning waits
            self._hurry.wait(self._interval)
            self._hurry.clear()
            self.flush()
        self.flush()  # what was queued as it closed

    def close(self) -> bool:
        """Stop the writer thread once it has written every queued line; wait at most
        :data:`CLOSE_WAIT` for that (the caller wrote them itself before, after the
        thread's lock: a wedged stderr held the process's exit for ever). False when
        the lines were not all written in that time."""
        self._closed = True
        self._hurry.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT)
        return not self._thread.is_alive()


def _fd_writer(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return write
