"""The configuration reference must match the schema (regenerate with
`python -m xwm_bridge.config_doc > docs/architecture/configuration.md`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xwm_bridge.config import BridgeConfig, GatewayConfig, Limits, ProviderConfig
from xwm_bridge.config_doc import DESCRIPTIONS, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture" / "configuration.md"


def test_every_key_is_described() -> None:
    keys = {f.name for f in dataclasses.fields(BridgeConfig)} - {"limits", "providers", "gateway"}
    keys |= {f"limits.{f.name}" for f in dataclasses.fields(Limits)}
    keys |= {f"gateway.{f.name}" for f in dataclasses.fields(GatewayConfig)}
    keys |= {f"providers[].{f.name}" for f in dataclasses.fields(ProviderConfig)}
    assert keys == set(DESCRIPTIONS)


def test_committed_reference_matches_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == render()
