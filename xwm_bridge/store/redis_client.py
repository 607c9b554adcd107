"""The Redis store's client: how it is built (its deadlines and its retry policy), and
which of its errors are an outage of the store rather than a bug.

Every command is one attempt bounded by ``store.redis_timeout``: the socket's connect
and read timeouts are that value, and redis-py retries nothing (:data:`RETRIES`; its
``Redis()`` default is ten retries with backoff, and a URL's ``retry_on_timeout`` adds
one), so a command Redis does not answer fails after at most ``redis_timeout`` on an
open connection (a new one: its connect and handshake too, each within it). On top of
that every store call has its own deadline (sessions.md, "Several replicas").
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from xwm_bridge.observability.logging import capped
from xwm_bridge.store import redis_reads
from xwm_bridge.store.base import StoreUnavailable

log = logging.getLogger("xwm_bridge.store")
#: redis-py's own retries of a command that failed on a timeout or a dropped connection:
#: none (a retry would multiply the wait past ``store.redis_timeout``; the caller's
#: request fails as an unavailable store, and the client retries it if it wants to)
RETRIES = 0
#: ``redis_url`` query options that would lengthen a command's wait: ``redis_timeout``
#: rules, the URL's values are ignored (logged)
TIMEOUT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
#: Redis away or too slow: an outage (logged without a traceback)
OUTAGES = (OSError, TimeoutError, aioredis.ConnectionError, aioredis.TimeoutError)


def connect(url: str, timeout: float) -> aioredis.Redis:
    """A client of ``url`` whose every command is one attempt within ``timeout``."""
    client = aioredis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), RETRIES),
    )
    kwargs = client.connection_pool.connection_kwargs  # the URL's options won over ours
    ignored = sorted(k for k in TIMEOUT_OPTIONS if kwargs.get(k) != timeout)
    if ignored:
        log.warning(
            "redis_url options ignored: store.redis_timeout bounds every command",
            extra={"options": ignored, "redis_timeout": timeout},
        )
    kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
    return client


def outage(exc: BaseException, where: str, waited: float) -> StoreUnavailable | None:
    """The :class:`StoreUnavailable` of a Redis at ``where`` that is away, too slow
    (``waited`` s) or refuses to serve (``redis_reads.refused``: read-only replica,
    memory full, loading…); ``None`` for any other error, which is a bug."""
    if isinstance(exc, OUTAGES):
        if isinstance(exc, TimeoutError) and not str(exc):  # our own deadline
            return StoreUnavailable(
                f"session store: Redis at {where} did not answer within {waited:g}s"
            )
        return StoreUnavailable(f"session store: cannot reach Redis at {where}: {exc}")
    if redis_reads.refused(exc):
        error = capped(f"{exc}", 300)
        return StoreUnavailable(
            f"session store: Redis at {where} refused ({type(exc).__name__}): {error}"
        )
    return None
