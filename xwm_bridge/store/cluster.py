"""Several replicas on one Redis: per-thread FIFO, leases with fencing, remote cancel.

Every turn takes a *ticket* when it is accepted: ``RPUSH`` onto the thread's
Redis list ``q:<thread>``, so the list order is the arrival order over all
replicas. A turn runs when its ticket is at the head; starting it increments
``fence:<thread>`` (the fencing token, also stored as ``holder:<thread>``; both
expire ``store.retention`` after the thread's last grant, as the records they fence).
The lease lasts while the ticket is at the head and the owning replica's
liveness key (``replica:<id>``, refreshed every ``lease_ttl/3``) exists: a
replica that dies stops refreshing it, and after ``lease_ttl`` the next waiter
pops the dead head and proceeds. A replica that was only paused finds on
release that its ticket is gone; the session writes it queues meanwhile are
dropped by the store because its fencing token is stale.

Within one replica, tickets are pushed under one lock and the turn is queued
locally before the lock is released, so the local FIFO and the Redis order can
never disagree (which would deadlock the thread).

``session.cancel`` for a turn running elsewhere: ``run:<session>`` names the
running replica; the cancel is published on ``cancel`` and that replica
cancels the turn locally.

``session.close``: published on ``close`` to every other replica; each drops its
in-memory copy of the session, and the one running its turn closes it as a local
``session.close`` would (cancel, and a store delete queued behind the turn's own
writes), so the turn's late writes are not kept and its end does not save the
record again.

``session.permission`` for a request another replica holds (the stored record
names its ``owner``): the answer is published on ``permission`` with a reply key;
the owner answers it locally, as if its own client had, and pushes the outcome
(its result or its error) onto the reply key, which the asking replica pops
within the store's timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from xwm_bridge.store.cluster_scripts import ACQUIRE, ENQUEUE, POP_IF_HEAD, RELEASE
from xwm_bridge.store.redis import RedisStore
from xwm_bridge.tasks import stop, wait_for

log = logging.getLogger("xwm_bridge.cluster")
POLL_MIN = 0.002
POLL_MAX = 0.1
QUEUE_TTL_MS = 86_400_000
MAX_REMEMBERED_THREADS = 65_536
#: releases Redis refused, kept for a retry (past it the oldest are given up, logged)
MAX_UNRELEASED = 65_536
T = TypeVar("T")


class LeaseLostError(Exception):
    """The turn's ticket was removed (this replica was presumed dead)."""


@dataclass(eq=False, slots=True)
class Ticket:
    thread_id: str
    value: str
    session_id: str
    fence: int = 0
    started: bool = False
    released: bool = False


Job = Callable[[], Awaitable[Any]]
CancelLocal = Callable[[str], bool]
#: another replica closed this session: forget it here (see the module docstring)
CloseLocal = Callable[[str], None]
#: answer a permission request this replica holds: the result, or raises ``RpcError``
AnswerLocal = Callable[[dict[str, Any]], dict[str, Any]]
#: how long a reply to a forwarded permission answer is kept for its asker
REPLY_TTL_MS = 30_000


class RemoteAnswerError(Exception):
    """The owning replica refused a forwarded answer: its JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Cluster:
    def __init__(
        self,
        store: RedisStore,
        cancel_local: CancelLocal,
        answer_local: AnswerLocal | None = None,
        close_local: CloseLocal | None = None,
    ) -> None:
        self.store = store
        self.client = store.client
        self._cancel_local = cancel_local
        self.close_local = close_local
        self.answer_local = answer_local
        self._ordering: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._enqueue = self.client.register_script(ENQUEUE)
        self._acquire = self.client.register_script(ACQUIRE)
        self._pop_if_head = self.client.register_script(POP_IF_HEAD)
        self._release = self.client.register_script(RELEASE)
        self._listener: asyncio.Task[None] | None = None
        #: releases whose pipeline failed: ticket → (thread, keys, args), retried by
        #: ``_retry_releases`` (a ticket left in ``q:<thread>`` blocks the thread on
        #: every replica for as long as this one lives)
        self._unreleased: OrderedDict[str, tuple[str, list[str], list[str | int]]] = OrderedDict()
        self._owed = asyncio.Event()
        self._retrier: asyncio.Task[None] | None = None
        #: thread → the fencing token this replica last released it with (bounded)
        self._last_token: OrderedDict[str, int] = OrderedDict()
        #: threads whose running turn follows this replica's own previous turn: no other
        #: replica wrote in between, so the in-memory session is current
        self._fresh: set[str] = set()
        #: session → its turns granted on this replica and not released yet: while one
        #: runs, another's release leaves ``run:<session>`` (a cancel still finds it)
        self._running: dict[str, int] = {}
        self._ready = asyncio.Event()
        #: how long a thread's fencing token outlives its last grant: as long as the
        #: records it fences (``store.retention``), at least as long as its queue
        self._fence_ttl_ms = max(QUEUE_TTL_MS, int(store.retention * 1000))

    def key(self, kind: str, name: str = "") -> str:
        return self.store.key(kind, name)

    def ordering(self, thread_id: str) -> asyncio.Lock:
        """Held while a turn takes its Redis place and its local place on ``thread_id``."""
        lock = self._ordering.get(thread_id)
        if lock is None:
            lock = self._ordering[thread_id] = asyncio.Lock()
        return lock

    @property
    def replica_id(self) -> str:
        return self.store.replica_id

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._listener = loop.create_task(self._listen(), name="cluster-cancel-listener")
        self._retrier = loop.create_task(self._retry_releases(), name="cluster-release-retry")
        await wait_for(self._ready.wait(), self.store.timeout)

    async def close(self) -> None:
        # each is cancelled until it ends (a cancel landing in a redis-py write can be
        # lost: tasks.stop), within the store's timeout (a command in flight ends by then)
        if self._listener is not None:
            await stop(self._listener, self.store.timeout + 1)
        if self._retrier is not None:
            await stop(self._retrier, self.store.timeout + 1)
        if self._unreleased:  # this replica's liveness key goes: the others pop them
            log.warning("closed with lease releases unsent", extra={"count": len(self._unreleased)})

    async def _ask(self, call: Awaitable[T]) -> T:
        """One Redis command of the lease protocol within the store's timeout. Redis
        away, too slow or refusing to serve (a read-only replica after a failover,
        memory full, loading…) is an unavailable store: the request that needed it fails
        as such (``-32603 session store unavailable``, logged without a traceback);
        another error answer (WRONGTYPE) is a bug and raised as it is."""
        timeout = self.store.timeout
        try:
            return await wait_for(call, timeout)
        except Exception as exc:
            raise self.store.outage(exc, timeout) from None

    # --- tickets ----------------------------------------------------------------------------

    def _lease_keys(self, ticket: Ticket) -> list[str]:
        return [
            self.key("q", ticket.thread_id),
            self.key("fence", ticket.thread_id),
            self.key("holder", ticket.thread_id),
            self.key("run", ticket.session_id),
        ]

    async def enqueue(self, thread_id: str, session_id: str) -> Ticket:
        """Take a place in the thread's cross-replica queue (call under ``ordering()``);
        an idle thread's lease is granted in the same round trip."""
        ticket = Ticket(thread_id, f"{self.replica_id}:{uuid.uuid4().hex}", session_id)
        args: list[str | int] = [ticket.value, self.replica_id, QUEUE_TTL_MS, self._fence_ttl_ms]
        try:
            token = await self._ask(self._enqueue(keys=self._lease_keys(ticket), args=args))
        except BaseException:
            # no answer is not no push: Redis may hold or have run it (stalled, the
            # connection lost after the send, the request cancelled). A ticket left
            # there, of a live replica, heads the thread on every replica: its release
            # is owed, sent by the retrier after lease_ttl / 3 (behind the push)
            self._owe(ticket, *self._release_call(ticket))
            raise
        ticket.fence = int(token)
        return ticket

    async def acquire(self, ticket: Ticket) -> int:
        """Wait until ``ticket`` heads its thread's queue; pop dead replicas' heads."""
        if ticket.fence > 0:  # granted when it was queued
            return self._granted(ticket, ticket.fence)
        keys = self._lease_keys(ticket)
        args: list[str | int] = [ticket.value, self.replica_id, QUEUE_TTL_MS, self._fence_ttl_ms]
        delay = POLL_MIN
        while True:
            if ticket.released:  # the caller gave up while the turn waited
                raise LeaseLostError(ticket.thread_id)
            token = int(await self._ask(self._acquire(keys=keys, args=args)))
            if token > 0:
                return self._granted(ticket, token)
            if token < 0:  # presumed dead while waiting (a long pause): queue again
                async with self.ordering(ticket.thread_id):
                    await self._ask(self.client.rpush(keys[0], ticket.value))
                continue
            head = await self._ask(self.client.lindex(keys[0], 0))
            if head is not None:
                owner = (head.decode() if isinstance(head, bytes) else str(head)).split(":", 1)[0]
                if owner != self.replica_id and not await self._ask(
                    self.store.replica_alive(owner)
                ):
                    popped = await self._ask(self._pop_if_head(keys=[keys[0]], args=[head]))
                    if popped:
                        log.warning(
                            "took over a thread from a dead replica",
                            extra={"thread_id": ticket.thread_id[:128], "replica": owner},
                        )
                        # its running turns become interrupted before this one loads them
                        await self.store.recover_orphans()
                        continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, POLL_MAX)

    def _granted(self, ticket: Ticket, token: int) -> int:
        ticket.fence = token
        if not ticket.started:
            self._running[ticket.session_id] = self._running.get(ticket.session_id, 0) + 1
        ticket.started = True
        self.store.fences[ticket.thread_id] = token
        if self._last_token.get(ticket.thread_id) == token - 1:
            self._fresh.add(ticket.thread_id)
        else:
            self._fresh.discard(ticket.thread_id)
        return token

    def must_reload(self, thread_id: str) -> bool:
        """Whether a turn on ``thread_id`` must re-read its session from Redis."""
        return thread_id not in self._fresh

    async def release(self, ticket: Ticket) -> None:
        """Give the thread to the next ticket, after this turn's queued session writes."""
        if ticket.released:
            return
        ticket.released = True
        if self.store.fences.get(ticket.thread_id) == ticket.fence:
            del self.store.fences[ticket.thread_id]
        if ticket.started:
            left = self._running.pop(ticket.session_id, 1) - 1
            if left:
                self._running[ticket.session_id] = left
            self._fresh.discard(ticket.thread_id)
            self._last_token[ticket.thread_id] = ticket.fence
            self._last_token.move_to_end(ticket.thread_id)
            while len(self._last_token) > MAX_REMEMBERED_THREADS:
                self._last_token.popitem(last=False)
        keys, args = self._release_call(ticket)
        done = self.store.queue_eval(RELEASE, keys, args)
        done.add_done_callback(lambda sent: self._sent(sent, ticket, keys, args))
        # answered only once released: a cancel sent after the answer finds nothing running
        with contextlib.suppress(TimeoutError):  # queued already: only the wait ends
            await wait_for(asyncio.shield(done), self.store.timeout)

    def _release_call(self, ticket: Ticket) -> tuple[list[str], list[str | int]]:
        """The keys and arguments of ``ticket``'s :data:`RELEASE`. While another turn of
        its session runs here, the session's running mark is left (no replica id matches
        the empty one)."""
        keys = [self.key("q", ticket.thread_id), self.key("run", ticket.session_id)]
        mark = "" if self._running.get(ticket.session_id) else self.replica_id
        return keys, [ticket.value, mark]

    def _sent(
        self, sent: asyncio.Future[bool], ticket: Ticket, keys: list[str], args: list[str | int]
    ) -> None:
        """A release's batch was sent: if Redis refused it, owe the release (retried)."""
        if not sent.cancelled() and sent.result():
            return
        self._owe(ticket, keys, args)

    def _owe(self, ticket: Ticket, keys: list[str], args: list[str | int]) -> None:
        """Keep ``ticket``'s release for :meth:`_retry_releases` (bounded)."""
        self._unreleased[ticket.value] = (ticket.thread_id, keys, args)
        while len(self._unreleased) > MAX_UNRELEASED:
            _, (thread, _, _) = self._unreleased.popitem(last=False)
            log.error("lease release given up", extra={"thread_id": thread[:128]})
        log.warning("lease release failed; retrying", extra={"thread_id": ticket.thread_id[:128]})
        self._owed.set()

    async def _retry_releases(self) -> None:
        """Send the releases Redis refused, oldest first, every ``lease_ttl / 3`` while
        any is owed (until Redis takes them)."""
        while True:
            await self._owed.wait()
            await asyncio.sleep(max(POLL_MAX, self.store.lease_ttl / 3))
            while self._unreleased:
                value, (thread, keys, args) = next(iter(self._unreleased.items()))
                try:
                    await wait_for(self._release(keys=keys, args=args), self.store.timeout)
                except Exception as exc:  # still away: the next round
                    log.debug("lease release retry failed", extra={"error": repr(exc)})
                    break
                self._unreleased.pop(value, None)
                log.info("lease release retried", extra={"thread_id": thread[:128]})
            if not self._unreleased:
                self._owed.clear()

    def wrap(self, ticket: Ticket, job: Job) -> Job:
        """The turn as run by the local queue: lease, run, release (ordered after the
        turn's writes, so the next holder reads them)."""

        async def run() -> Any:
            try:
                await self.acquire(ticket)
                return await job()
            finally:
                await self.release(ticket)

        return run

    # --- cancel across replicas ---------------------------------------------------------------

    async def cancel_remote(self, session_id: str) -> bool:
        """Ask the replica running ``session_id``'s turn to cancel it."""
        owner = await self._ask(self.client.get(self.key("run", session_id)))
        if owner is None:
            return False
        owner_id = owner.decode() if isinstance(owner, bytes) else str(owner)
        if owner_id == self.replica_id or not await self._ask(self.store.replica_alive(owner_id)):
            return False
        message = f"{owner_id}\n{session_id}"
        receivers = await self._ask(self.client.publish(self.key("cancel"), message))
        return bool(receivers)

    async def close_remote(self, session_id: str) -> bool:
        """Tell the other replicas ``session_id`` is closed; whether a live one of them
        was running its turn (then it cancels it)."""
        owner = await self._ask(self.client.get(self.key("run", session_id)))
        owner_id = owner.decode() if isinstance(owner, bytes) else str(owner or "")
        message = f"{self.replica_id}\n{session_id}"
        receivers = await self._ask(self.client.publish(self.key("close"), message))
        if not receivers or not owner_id or owner_id == self.replica_id:
            return False
        return bool(await self._ask(self.store.replica_alive(owner_id)))

    def _on_close(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        sender, _, session_id = text.partition("\n")
        if sender != self.replica_id and session_id and self.close_local is not None:
            self.close_local(session_id)

    # --- permission answers across replicas ---------------------------------------------------

    async def answer_remote(self, owner: str, answer: dict[str, Any]) -> dict[str, Any] | None:
        """Forward ``answer`` (``sessionId``, ``requestId``, ``optionId``, ``by``) to the
        replica ``owner``; its result, ``None`` when no live replica of that id listens.
        Raises :class:`RemoteAnswerError` with the owner's refusal, ``TimeoutError``
        when it does not reply within the store's timeout, ``StoreUnavailable`` when
        Redis does not answer (each call bounded like the lease protocol's)."""
        if owner == self.replica_id or not await self._ask(self.store.replica_alive(owner)):
            return None
        reply = self.key("reply", uuid.uuid4().hex)
        message = orjson.dumps({"owner": owner, "reply": reply, "answer": answer})
        receivers = await self._ask(self.client.publish(self.key("permission"), message))
        if not receivers:
            return None
        outcome = orjson.loads(await self._reply(owner, reply))
        error = outcome.get("error")
        if isinstance(error, dict):
            raise RemoteAnswerError(int(error.get("code", -32603)), str(error.get("message")))
        result: dict[str, Any] = outcome.get("result") or {}
        return result

    async def _reply(self, owner: str, reply: str) -> bytes | str:
        """The owner's reply to a forwarded answer, popped within the store's timeout.
        Each ``BLPOP`` blocks Redis-side for at most half of it, so a healthy Redis
        answers well within the client's socket timeout (the same value) and within
        ``_ask``'s bound; a Redis that does not is an unavailable store, an owner that
        does not reply a ``TimeoutError``."""
        timeout = self.store.timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # BLPOP rounds to whole ms and blocks for ever on 0: never ask for less than 10
        while (left := deadline - loop.time()) >= 0.01:
            popped = await self._ask(self.client.blpop([reply], min(left, timeout / 2)))
            if popped is not None:
                value: bytes | str = popped[1]
                return value
        raise TimeoutError(f"replica {owner} did not answer within {timeout:g}s")

    async def _on_answer(self, data: Any) -> None:
        try:
            message = orjson.loads(data)
            owner, reply, answer = message["owner"], message["reply"], message["answer"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("malformed forwarded permission answer dropped")
            return
        if owner != self.replica_id or self.answer_local is None:
            return
        outcome: dict[str, Any]
        try:
            outcome = {"result": self.answer_local(answer)}
        except Exception as exc:  # RpcError: its code and message go back to the asker
            code = getattr(exc, "code", -32603)
            outcome = {"error": {"code": code, "message": getattr(exc, "message", str(exc))}}
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.lpush(reply, orjson.dumps(outcome))
                pipe.pexpire(reply, REPLY_TTL_MS)
                await wait_for(pipe.execute(), self.store.timeout)
        except Exception as exc:  # the asker times out and says so
            log.warning("permission answer reply failed", extra={"error": repr(exc)})

    async def _listen(self) -> None:
        cancel, permission = self.key("cancel"), self.key("permission")
        close = self.key("close")
        while True:
            try:
                async with self.client.pubsub() as pubsub:
                    await pubsub.subscribe(cancel, permission, close)
                    self._ready.set()
                    while True:
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if msg is None or msg.get("type") != "message":
                            continue
                        channel = msg.get("channel")
                        channel = channel.decode() if isinstance(channel, bytes) else channel
                        if channel == permission:
                            await self._on_answer(msg["data"])
                        elif channel == close:
                            self._on_close(msg["data"])
                        else:
                            self._on_cancel(msg["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cancel listener reconnecting", extra={"error": repr(exc)})
                await asyncio.sleep(1)

    def _on_cancel(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        owner, _, session_id = text.partition("\n")
        if owner == self.replica_id:
            cancelled = self._cancel_local(session_id)
            log.info(
                "remote cancel", extra={"session_id": session_id[:128], "cancelled": cancelled}
            )
