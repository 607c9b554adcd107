"""The configuration reference must match the schema (regenerate with
`python -m xwm_bridge.config_doc > docs/architecture/configuration.md`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xwm_bridge.config import BridgeConfig, Limits, ProviderConfig
from xwm_bridge.config_doc import DESCRIPTIONS, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture" / "configuration.md"


def test_every_key_is_described() -> None:
    defaults = BridgeConfig()
    keys: set[str] = set()
    for f in dataclasses.fields(BridgeConfig):
        value = getattr(defaults, f.name)
        if f.name == "providers":
            keys |= {f"providers[].{g.name}" for g in dataclasses.fields(ProviderConfig)}
        elif dataclasses.is_dataclass(value):  # nested sections: limits, agents, …
            keys |= {f"{f.name}.{g.name}" for g in dataclasses.fields(value)}
        else:
            keys.add(f.name)
    assert {k for k in keys if k.startswith("limits.")} == {
        f"limits.{f.name}" for f in dataclasses.fields(Limits)
    }
    assert keys == set(DESCRIPTIONS)


def test_committed_reference_matches_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == render()
