"""Can the configured session store be used? The check ``doctor`` runs before a
daemon starts; a running store answers :meth:`SessionStore.health` itself.

:func:`probe_store` starts nothing and writes no session: SQLite — the state
directory can be created and written, the database (if any) takes the write
lock, and whether a running xwm-bridge holds it; Redis — ``PING`` within the
deadline; memory — nothing to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import sqlite3
from pathlib import Path
from urllib.parse import urlsplit

from xwm_bridge.config import BridgeConfig
from xwm_bridge.store import DB_NAME, state_dir
from xwm_bridge.store.base import StoreHealth
from xwm_bridge.store.sqlite_lock import lock_holder, lock_path
from xwm_bridge.tasks import wait_for

__all__ = ["StoreHealth", "probe_store"]


def _ok(backend: str, check: str, detail: str) -> StoreHealth:
    return StoreHealth(backend, check, True, detail=detail)


def _failed(backend: str, check: str, error: str) -> StoreHealth:
    return StoreHealth(backend, check, False, error=error)


def _sqlite(path: Path, timeout: float) -> StoreHealth:
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return _failed("sqlite", "writable", f"cannot create state directory {directory}: {exc}")
    if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
        return _failed("sqlite", "writable", f"state directory {directory} is not writable")
    in_use = ""
    lock = lock_path(path)
    if lock.exists():
        with contextlib.suppress(OSError):
            fd = os.open(lock, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = lock_holder(fd)
                in_use = f"; in use by a running xwm-bridge{f' (pid {pid})' if pid else ''}"
            finally:
                os.close(fd)
    if path.exists():
        try:
            db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
            try:
                version = db.execute("PRAGMA user_version").fetchone()[0]
                db.execute("BEGIN IMMEDIATE")  # the write lock: the file is writable
                db.execute("ROLLBACK")
            finally:
                db.close()
        except sqlite3.Error as exc:
            return _failed("sqlite", "writable", f"sqlite {path}: {exc}")
        return _ok("sqlite", "writable", f"sqlite {path} (layout {version}){in_use}")
    return _ok("sqlite", "writable", f"sqlite {path} (created on first start){in_use}")


async def _redis(url: str, deadline_s: float) -> StoreHealth:
    import redis.asyncio as aioredis

    from xwm_bridge.store import redis_client

    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or 6379}"  # never the password
    client = redis_client.connect(url, deadline_s)
    try:
        await wait_for(client.ping(), deadline_s)
    except (OSError, TimeoutError, aioredis.RedisError) as exc:
        return _failed("redis", "reachable", f"cannot reach Redis at {where}: {exc or 'timeout'}")
    finally:
        await client.aclose()
    return _ok("redis", "reachable", f"redis {where} answers PING")


async def probe_store(config: BridgeConfig, deadline_s: float = 5.0) -> StoreHealth:
    backend = config.store.backend
    if backend == "memory":
        return _ok("memory", "running", "memory: nothing survives a restart")
    if backend == "redis":
        return await _redis(config.store.redis_url, deadline_s)
    return await asyncio.to_thread(_sqlite, state_dir(config) / DB_NAME, deadline_s)
