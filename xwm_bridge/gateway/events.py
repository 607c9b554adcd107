"""The events a runtime reads (gateway.md §6): each goes to every turn's tap, a gap in
their sequence is logged, ``health`` is kept in the snapshot, pairing is logged, and
each is pushed to clients (``xworkmate.gateway.push``; a chat or agent run's event
also as ``chat.run``, normalized)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.notices import Notices
from xwm_bridge.gateway.snapshot import Snapshot

log = logging.getLogger("xwm_bridge.gateway")

#: a turn's event tap: gets every event frame; cheap and non-blocking.
Tap = Callable[[p.EventFrame], None]


class Events:
    def __init__(self, runtime_id: str = "") -> None:
        self._taps: set[Tap] = set()
        self._last_seq = 0
        self._runtime_id = runtime_id

    def add_tap(self, tap: Tap) -> None:
        self._taps.add(tap)

    def remove_tap(self, tap: Tap) -> None:
        self._taps.discard(tap)

    def new_socket(self) -> None:
        """A new socket's events count their sequence from scratch."""
        self._last_seq = 0

    def handle(self, ev: p.EventFrame, snapshot: Snapshot, notices: Notices) -> bool:
        """Handle one event; True when the gateway announced it is going away."""
        for tap in list(self._taps):
            try:
                tap(ev)
            except Exception:
                # one turn's bug: logged with its traceback; the other taps, the rest
                # of this event and the read loop go on
                log.error(
                    "gateway event tap failed",
                    exc_info=True,
                    extra={"runtime_id": self._runtime_id, "event": ev.event},
                )
        if ev.seq > 0:
            if self._last_seq and ev.seq > self._last_seq + 1:
                notices.log(
                    "warn", "sync", f"sequence gap detected | expected: {self._last_seq + 1}"
                )
            self._last_seq = max(self._last_seq, ev.seq)
        if ev.event in ("connect.challenge", "tick"):
            return False
        if ev.event == "health":
            snapshot.health_payload = ev.payload
            notices.snapshot(snapshot)
        elif ev.event in ("device.pair.requested", "device.pair.resolved"):
            req = ev.payload.get("requestId") or "unknown"
            dev = ev.payload.get("deviceId") or "unknown"
            notices.log("info", "pairing", f"{ev.event} | request: {req} | device: {dev}")
        elif ev.event == "seqGap":
            notices.log("warn", "sync", "sequence gap detected")
        elif ev.event in ("chat", "agent"):
            run = p.normalize_run(ev)
            if run is not None:
                notices.push("chat.run", run, ev.seq)
        notices.push(ev.event, ev.payload, ev.seq)
        return ev.event == "shutdown"
