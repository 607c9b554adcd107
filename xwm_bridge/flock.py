"""``flock(LOCK_EX)`` with a deadline (a blocking ``flock`` has none).

A stuck holder (another bridge, a hung NFS server) would keep the caller and its
worker thread waiting for ever; :func:`lock_until` polls ``LOCK_EX | LOCK_NB``
with a short backoff instead. Blocking: call it from a worker thread.
"""

from __future__ import annotations

import fcntl
import time


def lock_until(fd: int, deadline: float, busy: str) -> None:
    """Take an exclusive ``flock`` on ``fd`` before ``deadline`` (``time.monotonic()``),
    else raise :class:`TimeoutError` (an ``OSError``) with the text ``busy``."""
    pause = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(busy) from None
            time.sleep(min(pause, remaining))  # a worker thread: the event loop runs on
            pause = min(pause * 2, 0.1)
