"""How a turn runs: the execution modes of forwarding.md §3.6."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """The ``mode`` execution param; its value is the wire spelling."""

    SINGLE_AGENT = "single-agent"
    MULTI_AGENT = "multi-agent"
    GATEWAY_CHAT = "gateway-chat"

    @classmethod
    def of_target(cls, execution_target: str) -> Mode:
        """§3.4: ``gateway`` → gateway-chat, ``multi-agent`` → multi-agent, else single-agent."""
        if execution_target == "gateway":
            return cls.GATEWAY_CHAT
        if execution_target == cls.MULTI_AGENT:
            return cls.MULTI_AGENT
        return cls.SINGLE_AGENT
