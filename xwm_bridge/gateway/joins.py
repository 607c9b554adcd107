"""Client connects of one runtime that share one dial and handshake (gateway.md,
"Runtime lifecycle"): a connect with the same config as the one still running joins
it and answers what it answers, instead of waiting behind it and dialing again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.connect_config import ConnectConfig
from xwm_bridge.gateway.protocol import GatewayError

#: a client connect's answer: the ``hello-ok``, or why not
Outcome = tuple[p.Hello | None, GatewayError | None]


class Joins:
    def __init__(self) -> None:
        #: the connect running now and its outcome (``None``: its caller went away)
        self._running: tuple[ConnectConfig, asyncio.Future[Outcome | None]] | None = None

    async def connect(
        self,
        cfg: ConnectConfig,
        lock: asyncio.Lock,
        run: Callable[[ConnectConfig], Awaitable[Outcome]],
    ) -> Outcome:
        """``run(cfg)`` under ``lock``, or the outcome of the running one when its
        config is ``cfg``. If the joined connect's caller went away (its socket is
        closed then), this one runs its own; this one's caller going away leaves the
        joined connect running (shielded)."""
        running = self._running
        if running is not None and running[0] == cfg and not running[1].done():
            outcome = await asyncio.shield(running[1])
            if outcome is not None:
                return outcome
        async with lock:
            shared: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
            self._running = (cfg, shared)
            outcome = None
            try:
                outcome = await run(cfg)
                return outcome
            finally:
                self._running = None
                shared.set_result(outcome)
