"""SQLiteStore.close() with a store thread that does not stop: bounded, no helper
thread left behind, the lock held while the thread may still write."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from pathlib import Path

import pytest

from xwm_bridge.store import sqlite as sqlite_store
from xwm_bridge.store import sqlite_lock, sqlite_thread
from xwm_bridge.store.base import SessionRecord, StoreError
from xwm_bridge.store.sqlite import SQLiteStore

pytestmark = pytest.mark.asyncio


def non_daemon_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.daemon and t.is_alive()}


async def test_close_of_a_stuck_store_thread_is_bounded_and_keeps_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sqlite_store, "CLOSE_TIMEOUT", 0.3)
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    before = non_daemon_threads()
    loop = asyncio.get_running_loop()
    entered, release = asyncio.Event(), threading.Event()

    def stuck(db: sqlite3.Connection) -> None:  # a statement that does not return
        loop.call_soon_threadsafe(entered.set)
        release.wait(30)

    reader = asyncio.create_task(store._call(stuck))
    try:
        await asyncio.wait_for(entered.wait(), 10)
        store.save(SessionRecord("queued", "t"))  # behind the stuck read
        started = loop.time()
        with caplog.at_level(logging.ERROR, "xwm_bridge.store"):
            await asyncio.wait_for(store.close(), 10)  # returns: no TimeoutError
        assert loop.time() - started < 5
        assert any("did not stop" in r.getMessage() for r in caplog.records)
        # no non-daemon thread left waiting for it (3.11 would wait for it at exit)
        assert non_daemon_threads() <= before
        # the thread may still write: the lock stays held, also after a second close
        await store.close()
        with pytest.raises(StoreError, match="in use"):
            sqlite_lock.acquire(path)
    finally:
        release.set()
    await asyncio.wait_for(reader, 10)
    await asyncio.wait_for(asyncio.wrap_future(store._stopped), 10)
    # once it has ended, with the write queued behind it applied, the lock is free
    fd = sqlite_lock.acquire(path)
    sqlite_lock.release(fd)
    again = SQLiteStore(path)
    await again.start()
    try:
        assert await again.load("queued") is not None
    finally:
        await again.close()


async def test_close_applies_queued_writes_and_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    store.save(SessionRecord("s1", "t"))
    await store.close()
    assert store._thread is not None and not store._thread.is_alive()
    fd = sqlite_lock.acquire(path)
    sqlite_lock.release(fd)
    again = SQLiteStore(path)
    await again.start()
    try:
        assert await again.load("s1") is not None
    finally:
        await again.close()


async def test_start_that_times_out_keeps_the_lock_until_the_thread_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start() giving up on a slow open: the store thread may still open (and would
    then serve): the lock stays held until it has ended, and it ends without an error."""
    real_timeout = sqlite_store.READ_TIMEOUT
    monkeypatch.setattr(sqlite_store, "READ_TIMEOUT", 0.3)  # start()'s wait for the open
    loop = asyncio.get_running_loop()
    entered, release = asyncio.Event(), threading.Event()
    real_connect = sqlite_thread.connect

    def slow_connect(path: Path) -> sqlite3.Connection:
        loop.call_soon_threadsafe(entered.set)
        release.wait(30)
        return real_connect(path)

    monkeypatch.setattr(sqlite_thread, "connect", slow_connect)
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    try:
        with pytest.raises(StoreError, match="cannot open"):
            await asyncio.wait_for(store.start(), 10)
        await asyncio.wait_for(entered.wait(), 10)
        with pytest.raises(StoreError, match="in use"):  # the thread is still opening
            sqlite_lock.acquire(path)
    finally:
        release.set()
    await asyncio.wait_for(asyncio.wrap_future(store._stopped), 10)  # it stops once open
    assert thread_errors == []
    await store.close()
    monkeypatch.setattr(sqlite_thread, "connect", real_connect)
    # the normal wait again: a loaded machine can take more than 0.3 s to open the file
    monkeypatch.setattr(sqlite_store, "READ_TIMEOUT", real_timeout)
    again = SQLiteStore(path)  # the lock is free once it has ended
    await again.start()
    await again.close()
