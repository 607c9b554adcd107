"""Runs a lost socket left behind: their turns failed (``gateway connection lost during
the run``), but OpenClaw does not end a run when its client goes, and one whose model is
down retries for ever, holding its session key. The runtime sends their ``chat.abort``
once a new socket is up (:meth:`GatewayRuntime.abort_when_back
<xwm_bridge.gateway.runtime.GatewayRuntime.abort_when_back>`); this holds them until
then, bounded."""

from __future__ import annotations

import logging
from collections import OrderedDict

log = logging.getLogger("xwm_bridge.gateway")

#: runs kept for an abort at most; past it the oldest is given up (logged)
MAX_ORPHANS = 64


class Orphans:
    """(session key, run id) of the runs to abort once connected, oldest first."""

    def __init__(self, runtime_id: str, limit: int = MAX_ORPHANS) -> None:
        self._runtime_id = runtime_id
        self._limit = limit
        self._runs: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, session_key: str, run_id: str) -> None:
        self._runs[(session_key, run_id)] = None
        while len(self._runs) > self._limit:
            (_, given_up), _ = self._runs.popitem(last=False)
            log.warning(
                "gateway run left running: too many runs wait for their abort",
                extra={"runtime_id": self._runtime_id, "run_id": given_up, "limit": self._limit},
            )

    def take(self) -> list[tuple[str, str]]:
        """Every run kept, and none left."""
        runs = list(self._runs)
        self._runs.clear()
        return runs
