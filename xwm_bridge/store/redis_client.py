"""The Redis store's client: which of its errors are an outage of the store rather
than a bug."""

from __future__ import annotations

import redis.asyncio as aioredis

from xwm_bridge.observability.logging import capped
from xwm_bridge.store import redis_reads
from xwm_bridge.store.base import StoreUnavailable

#: Redis away or too slow: an outage (logged without a traceback)
OUTAGES = (OSError, TimeoutError, aioredis.ConnectionError, aioredis.TimeoutError)


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
