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
from xwm_bridge.store.records import PermissionRecord, TurnRecord
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.store.redis_reads import refused
from xwm_bridge.store.sqlite import SQLiteStore
from xwm_bridge.store.sqlite_writes import refused as sqlite_refused


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


def _garbage(tmp: Path) -> Path:
    path = tmp / "garbage.db"
    path.write_bytes(b"x" * 8192)
    return path


def _corrupt(tmp: Path) -> Path:
    """A database whose table's root page was overwritten: ``malformed``."""
    path = tmp / "corrupt.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (a)")
    db.executemany("INSERT INTO t VALUES (?)", [("x" * 100,) for _ in range(1000)])
    db.commit()
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    data = bytearray(path.read_bytes())
    data[page : 2 * page] = b"\xff" * page
    path.write_bytes(bytes(data))
    return path


def _query(path: Path | str, sql: str, *, setup: str = "", timeout: float = 5.0) -> None:
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        if setup:
            db.execute(setup)
        db.execute(sql).fetchall()
    finally:
        db.close()


def _locked(tmp: Path) -> None:
    path = tmp / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (a)")
        holder.execute("BEGIN EXCLUSIVE")
        _query(path, "INSERT INTO t VALUES (1)", timeout=0)
    finally:
        holder.close()


def _in_memory(sql: str, setup: str = "") -> Any:
    return lambda tmp: _query(":memory:", sql, setup=setup)


#: real errors of sqlite3 (3.11: with ``sqlite_errorcode``), as a store's read or write
#: meets them; an outage is StoreUnavailable, anything else a bug or a bad record
SQLITE_ERRORS: list[tuple[str, Any, bool]] = [
    ("database is locked", _locked, True),
    ("readonly database", _in_memory("CREATE TABLE t (a)", "PRAGMA query_only = ON"), True),
    ("unable to open", lambda t: _query(t / "missing" / "x.db", "SELECT 1"), True),
    ("not a database", lambda t: _query(_garbage(t), "SELECT * FROM sqlite_master"), True),
    ("malformed", lambda t: _query(_corrupt(t), "SELECT * FROM t"), True),
    ("no such table", _in_memory("SELECT * FROM sessions"), False),
    ("no such column", _in_memory("SELECT b FROM t", "CREATE TABLE t (a)"), False),
    ("syntax error", _in_memory("SELEC 1"), False),
    (
        "UNIQUE constraint",
        _in_memory("INSERT INTO t VALUES (1), (1)", "CREATE TABLE t (a UNIQUE)"),
        False,
    ),
]


def _error(tmp: Path, make: Any) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as raised:
        make(tmp)
    return raised.value


@pytest.mark.parametrize(
    ("name", "make", "outage"), SQLITE_ERRORS, ids=[e[0] for e in SQLITE_ERRORS]
)
def test_which_sqlite_errors_are_an_outage(
    tmp_path: Path, name: str, make: Any, outage: bool
) -> None:
    """By SQLite's result code: ``OperationalError`` is also what ``no such table``, a
    missing column and a syntax error raise (SQLITE_ERROR: our SQL or a schema we do not
    know), which is a bug, not an outage; and an error the driver raised itself (no
    code) is not one either."""
    error = _error(tmp_path, make)
    assert name in str(error)
    assert sqlite_refused(error) is outage


def test_an_sqlite_error_without_a_result_code_is_not_an_outage() -> None:
    assert not sqlite_refused(sqlite3.OperationalError("database is locked"))  # not SQLite's
    assert not sqlite_refused(MemoryError())  # SQLITE_NOMEM, as CPython raises it


async def test_sqlite_a_damaged_file_is_store_unavailable_a_bug_is_not(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    await store.start()
    try:
        damaged = _error(tmp_path, lambda t: _query(_corrupt(t), "SELECT * FROM t"))
        with pytest.raises(StoreUnavailable, match="malformed") as err:
            await store._call(_raise(damaged))
        assert str(path) in str(err.value)
        garbage = _garbage(tmp_path)
        with pytest.raises(StoreUnavailable, match="not a database"):
            await store._call(lambda db: _query(garbage, "SELECT * FROM sqlite_master"))
        with pytest.raises(StoreUnavailable, match="readonly"):
            await store._call(lambda db: db.execute("PRAGMA query_only = ON"))  # for the next
            await store._call(lambda db: db.execute("DELETE FROM sessions"))
        await store._call(lambda db: db.execute("PRAGMA query_only = OFF"))
        for bug in (sqlite3.IntegrityError("UNIQUE constraint failed"), sqlite3.ProgrammingError()):
            with pytest.raises(type(bug)):
                await store._call(_raise(bug))
        # SQL we got wrong, or a schema we do not know: raised as the bug it is (the
        # dispatcher logs it with its traceback), not "session store unavailable"
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store._call(lambda db: db.execute("SELECT * FROM no_such_table"))
        with pytest.raises(sqlite3.OperationalError, match="no such column"):
            await store._call(lambda db: db.execute("SELECT no_such_column FROM sessions"))
        assert await store.load("s1") is None  # the store goes on
    finally:
        await store.close()


async def test_sqlite_writes_to_a_damaged_file_are_failed_writes_not_bad_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="xwm_bridge.store")
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        applied = store._apply
        malformed = _error(tmp_path, lambda t: _query(_corrupt(t), "SELECT * FROM t"))

        def damaged(db: sqlite3.Connection, writes: Any) -> None:
            raise malformed

        monkeypatch.setattr(store, "_apply", damaged)
        store.save(SessionRecord("s1", "t"))
        store.save(SessionRecord("s2", "t"))
        await store._call(lambda db: None)  # after the writes queued before it
        assert (store.counters.write_errors, store.counters.bad_records) == (2, 0)
        assert "malformed" in store.counters.last_error
        assert not store.alive()  # /readyz: not ready while writes fail
        assert not any(r.exc_info for r in caplog.records)  # an outage: no traceback
        monkeypatch.setattr(store, "_apply", applied)
    finally:
        await store.close()


async def test_sqlite_a_write_failing_on_a_bug_is_logged_with_its_traceback_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A write SQLite fails with ``no such table`` (our SQL, or a schema we do not know)
    is not a refusal of the backend: the batch is applied write by write, so only the
    writes that hit the bug are dropped, each counted as a failed write and logged with
    its traceback (once per error in the batch). It dropped the whole batch, logged as
    an outage without a traceback."""
    caplog.set_level(logging.ERROR, logger="xwm_bridge.store")
    store = SQLiteStore(tmp_path / "sessions.db")
    await store.start()
    try:
        await store._call(lambda db: db.execute("DROP TABLE turns"))
        store.save(SessionRecord("s1", "t"))
        store.save_turn(TurnRecord("s1", "turn-1", started_at=1.0))
        store.save_turn(TurnRecord("s1", "turn-2", started_at=2.0))
        store.save(SessionRecord("s2", "t"))
        assert await store.load("s1") is not None and await store.load("s2") is not None
        assert (store.counters.write_errors, store.counters.bad_records) == (2, 0)
        assert "no such table: turns" in store.counters.last_error
        logged = [
            r for r in caplog.records if r.getMessage() == "session store write failed; dropped"
        ]
        assert [r.exc_info is not None for r in logged] == [True, False]
        assert all("no such table: turns" in getattr(r, "error", "") for r in logged)
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
