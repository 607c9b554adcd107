"""Frames a runtime read and dropped (gateway.md §5.2: ignored, never a failure):
counted per runtime and, by reason, for every runtime of the manager
(``xwm_gateway_frames_ignored_total``), and logged without flooding the log."""

from __future__ import annotations

import logging

log = logging.getLogger("xwm_bridge.gateway")


class IgnoredFrames:
    def __init__(self, runtime_id: str, by_reason: dict[str, int] | None = None) -> None:
        self._runtime_id = runtime_id
        #: this runtime's total
        self.total = 0
        #: shared with the manager's other runtimes (reaped ones included)
        self._by_reason = by_reason if by_reason is not None else {}
        self._logged: set[str] = set()  # reasons already logged as warnings on this socket

    @property
    def runtime_id(self) -> str:
        return self._runtime_id

    def new_socket(self) -> None:
        self._logged.clear()

    def note(self, reason: str, data: str | bytes) -> None:
        """Count a dropped frame; the first of each reason per socket is a warning,
        the rest debug lines (a gateway sending garbage cannot flood the log)."""
        self.total += 1
        self._by_reason[reason] = self._by_reason.get(reason, 0) + 1
        first = reason not in self._logged
        self._logged.add(reason)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "gateway frame ignored",
            extra={
                "runtime_id": self._runtime_id,
                "reason": reason,
                "frame_type": "binary" if isinstance(data, bytes) else "text",
                "frame_bytes": len(data),
            },
        )
