"""What a gateway runtime tells its clients (gateway.md §7.1): ``xworkmate.gateway.log``
(each line also in the bridge's own log), ``snapshot`` and ``push``, queued on the
runtime's fan-out for every target (``fanout.Fanout.publish``: never waits on one)."""

from __future__ import annotations

import logging
import time
from typing import Any

from xwm_bridge.gateway.fanout import Fanout
from xwm_bridge.gateway.snapshot import Snapshot

log = logging.getLogger("xwm_bridge.gateway")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Notices:
    def __init__(self, fanout: Fanout, runtime_id: str) -> None:
        self._fanout = fanout
        self._runtime_id = runtime_id

    def log(self, level: str, category: str, message: str) -> None:
        getattr(log, "warning" if level == "warn" else level)(
            message, extra={"runtime_id": self._runtime_id, "category": category}
        )
        entry = {"timestampMs": now_ms(), "level": level, "category": category, "message": message}
        self._publish("log", "log", entry)

    def snapshot(self, snap: Snapshot) -> None:
        self._publish("snapshot", "snapshot", snap.wire())

    def push(self, event: str, payload: dict[str, Any], seq: int) -> None:
        self._publish("push", "event", {"event": event, "payload": payload, "sequence": seq})

    def _publish(self, kind: str, key: str, value: Any) -> None:
        """Queue ``xworkmate.gateway.<kind>`` for every target (never waits on one)."""
        self._fanout.publish(
            f"xworkmate.gateway.{kind}", {"runtimeId": self._runtime_id, key: value}
        )
