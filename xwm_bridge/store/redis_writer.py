"""The Redis store's writer task: the one owner of the order of writes and reads
(``redis.py``).

Per batch: every queued write in one pipeline, then every queued read at once. A
read sees every write queued before it (and possibly some queued just after it,
in the same batch); a queued script (``queue_eval``: the cluster's) runs after
every write queued before it. A batch that fails is logged, its readers get the
error, and the writer goes on; on close, what it did not send is counted.

:class:`WriterTask` is the base of :class:`~xwm_bridge.store.redis.RedisStore`,
which makes the state declared here; the store's lifecycle, its queued writes
and its reads are in ``redis.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from xwm_bridge.observability.logging import capped
from xwm_bridge.store import redis_client, redis_reads
from xwm_bridge.store.base import StoreCounters, StoreUnavailable, WriteBacklog
from xwm_bridge.store.redis_writes import WRITES, Commands, Op
from xwm_bridge.tasks import wait_for

log = logging.getLogger("xwm_bridge.store")
MAX_BATCH = 1024
Call = Callable[[aioredis.Redis], Awaitable[Any]]
OUTAGES = redis_client.OUTAGES


class WriterTask:
    """The writer task's loop and what it does with a batch."""

    client: aioredis.Redis
    timeout: float
    counters: StoreCounters
    backlog: WriteBacklog
    _ops: asyncio.Queue[Op]
    #: the writer task's batch not sent yet (what a close that gives up leaves unsent)
    _current: list[Op]
    _commands: Commands
    #: where Redis is, for messages (never the password)
    _where: str

    def _drop_unsent(self) -> None:
        """After the writer stopped: count and log the writes it did not send (a close
        that gave up on a Redis not answering), and answer their waiters."""
        left, self._current = self._current, []
        while not self._ops.empty():
            left.append(self._ops.get_nowait())
        for op in left:
            if op[0] == "eval" and not op[4].done():
                op[4].set_result(False)
            elif op[0] == "call" and not op[2].done():
                op[2].set_exception(StoreUnavailable("session store closed"))
        lost = sum(op[0] in WRITES for op in left)
        if lost:
            self.counters.write_errors += lost
            self.counters.failed(f"closed with {lost} writes unsent")
            log.error(
                "session store closed with writes unsent; dropped",
                extra={"ops": lost, "waited_s": self.timeout * 2},
            )

    def queue_eval(
        self, script: str, keys: list[str], args: list[str | int]
    ) -> asyncio.Future[bool]:
        """Queue a script with the writes: it runs after every write queued before it.
        The future resolves once the batch holding it has been sent: True if Redis
        took the batch, False if it failed (the script may not have run)."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._ops.put_nowait(("eval", script, keys, args, done))
        return done

    async def _flush(self, writes: list[Op]) -> None:
        if not writes:
            return
        pipe = self.client.pipeline(transaction=False)
        ok = False
        try:
            # building the commands too: a write it cannot take is a failed write,
            # not a restart of the writer (which goes on)
            self._commands.batch(pipe, writes)
            await wait_for(pipe.execute(), self.timeout)
        except Exception as exc:
            self.counters.write_errors += len(writes)
            self.counters.failed(f"{type(exc).__name__}: {exc}")
            outage = isinstance(exc, OUTAGES) or redis_reads.refused(exc)  # else a bug
            error = capped(f"{type(exc).__name__}: {exc}", 300)
            log.error(
                "session store write failed",
                exc_info=not outage,
                extra={"ops": len(writes), "store": self._where, "error": error},
            )
        else:
            self.counters.last_error = ""
            ok = True
        for op in writes:
            if op[0] == "eval" and not op[4].done():
                op[4].set_result(ok)
        writes.clear()

    def _dropped(self, kind: str, session_id: str, exc: Exception) -> None:
        self.counters.bad_records += 1
        log.error(
            "session store dropped a record",
            extra={"op": kind, "session_id": session_id[:128], "error": capped(f"{exc}", 300)},
        )

    async def _serve(self) -> None:
        """Per batch: every queued write in one pipeline, then every queued read at once.

        A read sees every write queued before it, and possibly some queued after it
        in the same batch (the catch-up stream de-duplicates that overlap); one
        batch costs two round trips however many turns share it. Nothing ends the
        loop but ``stop``: a batch that fails is logged and its readers get the error.
        """
        while True:
            batch = [await self._ops.get()]
            while len(batch) < MAX_BATCH and not self._ops.empty():
                batch.append(self._ops.get_nowait())
            try:
                writes = [op for op in batch if op[0] in WRITES]
                reads = [op for op in batch if op[0] == "call"]
                self._current = [*writes, *reads]  # not sent yet
                await self._flush(writes)
                self._current = [*reads]
                await self._run_reads(reads)
            except Exception as exc:
                self.counters.restarts += 1
                log.exception("session store batch failed; the writer goes on")
                for op in batch:
                    if op[0] == "call" and not op[2].done():
                        op[2].set_exception(exc)
                    elif op[0] == "eval" and not op[4].done():
                        op[4].set_result(False)
            self._current = []
            self.backlog.drained()
            if any(op[0] == "stop" for op in batch):
                return

    async def _run_reads(self, reads: list[Op]) -> None:
        """Consecutive reads run concurrently (one round trip for all of them)."""
        if reads:
            await asyncio.gather(*(self._read(fn, fut) for _, fn, fut in reads))
            reads.clear()

    async def _read(self, fn: Call, fut: asyncio.Future[Any]) -> None:
        if fut.done():
            return
        try:
            value = await wait_for(fn(self.client), self.timeout * 2)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(value)
