"""Room for a new runtime in the manager's table (gateway.md §9): at most
``gateway.max_runtimes_per_principal`` runtimes per principal and
``gateway.max_runtimes`` on the bridge; the connects refused for want of room,
counted by reason (``xwm_gateway_connects_refused_total``), and one warning per
spell of a full bridge."""

from __future__ import annotations

import logging

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway.protocol import GatewayError

log = logging.getLogger("xwm_bridge.gateway")

#: why a connect that needed a new runtime was refused (``TOO_MANY``), for metrics
REFUSAL_REASONS = ("per_principal", "bridge")


class RuntimeLimits:
    def __init__(self, settings: GatewayConfig) -> None:
        self._settings = settings
        #: connects refused for want of room, by reason
        self._refused: dict[str, int] = dict.fromkeys(REFUSAL_REASONS, 0)
        #: the bridge-wide limit refused a connect since the table last had room
        self._full = False

    def refused(self) -> dict[str, int]:
        """Connects refused with ``TOO_MANY``, by reason."""
        return dict(self._refused)

    def refusal(self, principal: str, held: int, total: int) -> GatewayError | None:
        """Why a new runtime of ``principal`` (which holds ``held`` of the table's
        ``total``) may not be made; ``None`` if it may."""
        limits = self._settings
        if held >= limits.max_runtimes_per_principal:
            self._refused["per_principal"] += 1
            return GatewayError("too many gateway runtimes for this client", "TOO_MANY")
        if total < limits.max_runtimes:
            self._full = False
            return None
        self._refused["bridge"] += 1
        if not self._full:  # once per full spell: a flood of bearers is not a flood of lines
            self._full = True
            log.warning(
                "gateway runtime refused: the bridge holds gateway.max_runtimes runtimes",
                extra={"limit": limits.max_runtimes, "principal": principal},
            )
        return GatewayError("too many gateway runtimes on this bridge", "TOO_MANY")
