"""Gateway errors and their classification (gateway.md §5.3, §8.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce

FATAL_CODES = frozenset({"INVALID_REQUEST", "UNAUTHORIZED", "NOT_PAIRED", "AUTH_REQUIRED"})
FATAL_DETAIL_CODES = frozenset(
    {
        "AUTH_REQUIRED",
        "AUTH_UNAUTHORIZED",
        "AUTH_TOKEN_MISSING",
        "AUTH_TOKEN_MISMATCH",
        "AUTH_PASSWORD_MISSING",
        "AUTH_PASSWORD_MISMATCH",
        "AUTH_DEVICE_TOKEN_MISMATCH",
        "PAIRING_REQUIRED",
        "DEVICE_IDENTITY_REQUIRED",
        "CONTROL_UI_DEVICE_IDENTITY_REQUIRED",
    }
)
# Beyond the original's table: a protocol refusal never heals by retrying, and
# today's gateways put the auth reason in the top-level code.
EXTRA_FATAL = frozenset({"PROTOCOL_MISMATCH", "NOT_PAIRED", "PAIRING_REQUIRED"})


# --- errors ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GatewayError(Exception):
    message: str
    code: str = ""
    details: Any = None

    def __str__(self) -> str:
        return self.message

    @property
    def detail_code(self) -> str:
        if isinstance(self.details, dict):
            return coerce.text(self.details.get("code"))
        return ""

    @property
    def fatal(self) -> bool:
        return is_fatal(self.code, self.detail_code)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"message": self.message}
        if self.code:
            out["code"] = self.code
        if self.details not in (None, {}, [], ""):
            out["details"] = self.details
        return out


def is_fatal(code: str, detail_code: str = "") -> bool:
    """Non-retryable (§8.3, plus protocol/pairing refusals and any ``AUTH_*`` detail)."""
    c = code.strip().upper()
    d = detail_code.strip().upper()
    if c in FATAL_CODES or c in EXTRA_FATAL or c in FATAL_DETAIL_CODES:
        return True
    return d in FATAL_DETAIL_CODES or d in EXTRA_FATAL


def error_from_frame(error: Any) -> GatewayError:
    err = error if isinstance(error, dict) else {}
    details = err.get("details")
    return GatewayError(
        message=coerce.text(err.get("message"), "gateway request failed"),
        code=coerce.text(err.get("code")),
        details=details if isinstance(details, dict) and details else None,
    )
