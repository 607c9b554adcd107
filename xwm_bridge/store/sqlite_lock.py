"""The SQLite store's state-dir lock: ``<db>.lock``, held (``flock``) by the one
process that uses the database, with its pid written in it for the message of the
next one. The store (``sqlite.py``) holds it for its life; ``health.py`` asks
whether a running bridge holds it."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from xwm_bridge.store.base import StoreError


def lock_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".lock")


def lock_holder(fd: int) -> str:
    """The pid written in a lock file (may be stale or empty)."""
    with contextlib.suppress(OSError, ValueError):
        return os.pread(fd, 32, 0).decode().strip()
    return ""


def acquire(db_path: Path) -> int:
    """Hold ``<db>.lock`` (the fd to keep open): a second process on the same database
    would mark this one's running turns interrupted and fork its sessions. Held
    elsewhere: :class:`StoreError` naming the holder's pid."""
    fd = os.open(lock_path(db_path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(fd)
        os.close(fd)
        raise StoreError(
            f"session store: {db_path} is in use by another xwm-bridge process"
            f"{f' (pid {holder})' if holder else ''}; run one process per state "
            "directory: give this one its own store.state_dir (XWM_STATE_DIR), or "
            "XWM_SESSION_STORE=memory"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def release(fd: int) -> None:
    """Empty the lock file (no stale pid) and close it, which releases the flock."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)  # releases the flock
