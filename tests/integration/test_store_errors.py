"""Backend errors of a store read: an outage (the backend refuses: a Redis replica, memory
full, a damaged SQLite file) is ``StoreUnavailable`` — ``-32603 session store
unavailable``, a warning with no traceback — and a bug stays an error with its traceback."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as rex

from tests.conftest import closed_port
from tests.redis_server import redis_server
from xwm_bridge.store import redis_reads
from xwm_bridge.store.base import RUNNING, SessionRecord, StoreUnavailable
from xwm_bridge.store.records import PermissionRecord
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.store.redis_reads import refused
from xwm_bridge.store.sqlite import SQLiteStore


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (rex.ReadOnlyError("You can't write against a read only replica."), True),
        (rex.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
        (rex.BusyLoadingError("Redis is loading the dataset in memory"), True),
        (rex.MasterDownError("Link with MASTER is down"), True),
        (rex.ResponseError("BUSY Redis is busy running a script."), True),
        (rex.ResponseError("MISCONF Redis is configured to save RDB snapshots"), True),
        (rex.ResponseError("Command # 1 (EVAL …) of pipeline caused error: BUSY …"), True),
        (rex.ResponseError("NOREPLICAS Not enough good replicas to write."), True),
        (rex.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"), False),
        (rex.ResponseError("ERR Error running script (call to f_x): @user_script:3"), False),
        (rex.NoScriptError("No matching script."), False),
        (rex.DataError("Invalid input of type: 'dict'"), False),
        (ValueError("BUSY"), False),
    ],
)
def test_which_redis_answers_are_an_outage(error: Exception, outage: bool) -> None:
    assert refused(error) is outage


async def test_redis_refusals_of_a_read_are_store_unavailable(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="err:")
        await store.start()
        other = RedisStore(server.url, prefix="err:", replica_id="gone")
        await other.start()
        try:
            other.save(SessionRecord("s1", "t1", last_turn_status=RUNNING))
            await other.flush()
            await other.close()  # its replica key goes: s1's turn is to be recovered
            db = store.client
            where = f"127.0.0.1:{server.port}"
            # a replica of a master it lost, serving no stale data: every read refused
            await db.config_set("replica-serve-stale-data", "no")
            await db.execute_command("REPLICAOF", "127.0.0.1", str(closed_port()))
            with pytest.raises(StoreUnavailable, match="MASTER is down") as err:
                await store.load("s1")
            assert where in str(err.value)
            # serving stale data: reads go, the recovery's writes are refused (READONLY)
            await db.config_set("replica-serve-stale-data", "yes")
            assert await store.load("s1") is not None
            with pytest.raises(StoreUnavailable, match="read only replica"):
                await store.recover()
            await db.execute_command("REPLICAOF", "NO", "ONE")
            # memory full (OOM)
            await db.config_set("maxmemory", "1")
            try:
                with pytest.raises(StoreUnavailable, match="maxmemory"):
                    await store.recover()
            finally:
                await db.config_set("maxmemory", "0")
            assert await store.recover() == ["s1"]  # and it goes once Redis is back
        finally:
            await store.close()


async def test_a_redis_bug_stays_an_error(tmp_path: Path) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="bug:")
        await store.start()
        try:
            await store.client.set("bug:s:s1", "not a hash")  # not a store's key: WRONGTYPE
            with pytest.raises(rex.ResponseError, match="WRONGTYPE"):
                await store.load("s1")
        finally:
            await store.close()


async def test_redis_write_outage_is_logged_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="w:")
        await store.start()
        try:
            await store.client.config_set("maxmemory", "1")
            try:
                with caplog.at_level(logging.ERROR, "xwm_bridge.store"):
                    store.save(SessionRecord("s1", "t1"))
                    await store.flush()
            finally:
                await store.client.config_set("maxmemory", "0")
            (logged,) = [
                r for r in caplog.records if r.getMessage() == "session store write failed"
            ]
            assert not logged.exc_info
            assert "OutOfMemoryError" in getattr(logged, "error", "")
            assert store.counters.write_errors == 1
        finally:
            await store.close()


def _raise(exc: Exception) -> Any:
    def fn(db: sqlite3.Connection) -> None:
        raise exc

    return fn


async def test_sqlite_a_damaged_file_is_store_unavailable_a_bug_is_not(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    try:
        damaged = sqlite3.DatabaseError("database disk image is malformed")
        with pytest.raises(StoreUnavailable, match="malformed") as err:
            await store._call(_raise(damaged))
        assert str(path) in str(err.value)
        with pytest.raises(StoreUnavailable, match="not a database"):
            await store._call(_raise(sqlite3.DatabaseError("file is not a database")))
        for bug in (sqlite3.IntegrityError("UNIQUE constraint failed"), sqlite3.ProgrammingError()):
            with pytest.raises(type(bug)):
                await store._call(_raise(bug))
        assert await store.load("s1") is None  # the store goes on
    finally:
        await store.close()


async def test_sqlite_writes_to_a_damaged_file_are_failed_writes_not_bad_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        applied = store._apply

        def damaged(db: sqlite3.Connection, writes: Any) -> None:
            raise sqlite3.DatabaseError("database disk image is malformed")

        monkeypatch.setattr(store, "_apply", damaged)
        store.save(SessionRecord("s1", "t"))
        store.save(SessionRecord("s2", "t"))
        await store._call(lambda db: None)  # after the writes queued before it
        assert (store.counters.write_errors, store.counters.bad_records) == (2, 0)
        assert "malformed" in store.counters.last_error
        assert not store.alive()  # /readyz: not ready while writes fail
        monkeypatch.setattr(store, "_apply", applied)
    finally:
        await store.close()


async def test_redis_pending_permissions_liveness_check_outage_is_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``permissions`` asks whether each request's replica is alive: Redis going away
    between the listing and that check is an outage too, not a raw redis error."""
    async with redis_server(tmp_path) as server:
        store = RedisStore(server.url, prefix="err:", timeout=1.0)
        await store.start()
        other = RedisStore(server.url, prefix="err:", replica_id="other")
        await other.start()
        try:
            other.save(SessionRecord("s1", "t1"))
            other.save_permission(PermissionRecord("s1", "r1", created_at=1.0))
            await other.flush()
            await other.close()
            listed = redis_reads.permissions

            async def listing_then_outage(db: Any, prefix: str) -> list[PermissionRecord]:
                found = await listed(db, prefix)
                server.proc.kill()  # Redis goes away before the owners are checked
                await server.proc.wait()
                return found

            monkeypatch.setattr(redis_reads, "permissions", listing_then_outage)
            with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{server.port}"):
                await store.permissions()
        finally:
            await store.close()
