"""A real ``redis-server`` on loopback for the store and replica tests (issue 6).

Installed by ``.ci/run`` (apt ``redis-server``). Tests skip with a visible
reason when it is missing locally and fail when ``CI=true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import closed_port

REDIS_BIN = shutil.which("redis-server") or ""


def require_redis() -> None:
    if REDIS_BIN:
        return
    message = "redis-server not installed (apt-get install redis-server; .ci/run does)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class RedisServer:
    proc: asyncio.subprocess.Process
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@contextlib.asynccontextmanager
async def redis_server(tmp: Path) -> AsyncIterator[RedisServer]:
    require_redis()
    port = closed_port()
    proc = await asyncio.create_subprocess_exec(
        REDIS_BIN,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(tmp),
        "--maxclients", "256",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if loop.time() > deadline or proc.returncode is not None:
                    raise RuntimeError("redis-server did not start") from None
                await asyncio.sleep(0.05)
            else:
                writer.close()
                break
        yield RedisServer(proc, port)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
