"""xwm_bridge.store.sqlite_lock: one process per database (``<db>.lock``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xwm_bridge.store import sqlite_lock
from xwm_bridge.store.base import StoreError


def test_a_held_lock_is_refused_with_its_holders_pid(tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    fd = sqlite_lock.acquire(db)
    lock = sqlite_lock.lock_path(db)
    assert lock == tmp_path / "sessions.db.lock"
    assert lock.read_text() == f"{os.getpid()}\n"
    # flock is per open file: a second open in this process is refused like another's
    with pytest.raises(StoreError, match=rf"{db} is in use .* \(pid {os.getpid()}\)"):
        sqlite_lock.acquire(db)
    sqlite_lock.release(fd)
    assert lock.read_text() == ""  # no stale pid left behind
    sqlite_lock.release(sqlite_lock.acquire(db))  # free again


def test_the_holder_of_an_empty_lock_file_is_unknown(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("")
    fd = os.open(lock, os.O_RDONLY)
    try:
        assert sqlite_lock.lock_holder(fd) == ""
    finally:
        os.close(fd)
