"""Room for a new runtime: the two limits, refusals by reason, one warning a spell."""

from __future__ import annotations

import pytest

from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway.limits import RuntimeLimits

SETTINGS = GatewayConfig(max_runtimes=3, max_runtimes_per_principal=2)


def warnings(caplog: pytest.LogCaptureFixture) -> int:
    return sum("gateway.max_runtimes runtimes" in r.getMessage() for r in caplog.records)


def test_a_principal_under_both_limits_has_room() -> None:
    limits = RuntimeLimits(SETTINGS)
    assert limits.refusal("alice", held=1, total=2) is None
    assert limits.refused() == {"per_principal": 0, "bridge": 0}


def test_a_principal_at_its_own_limit_is_refused_first() -> None:
    limits = RuntimeLimits(SETTINGS)
    refusal = limits.refusal("alice", held=2, total=3)
    assert refusal is not None and refusal.code == "TOO_MANY"
    assert refusal.message == "too many gateway runtimes for this client"
    assert limits.refused() == {"per_principal": 1, "bridge": 0}


def test_a_full_bridge_refuses_and_warns_once_per_full_spell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = RuntimeLimits(SETTINGS)
    for owner in ("bearer:a", "bearer:b"):
        refusal = limits.refusal(owner, held=0, total=3)
        assert refusal is not None and refusal.code == "TOO_MANY"
        assert refusal.message == "too many gateway runtimes on this bridge"
    assert limits.refused() == {"per_principal": 0, "bridge": 2} and warnings(caplog) == 1
    assert limits.refusal("bearer:c", held=0, total=2) is None  # room again: the spell ends
    assert limits.refusal("bearer:d", held=0, total=3) is not None
    assert limits.refused() == {"per_principal": 0, "bridge": 3} and warnings(caplog) == 2
