"""The configuration reference must match the schema (regenerate with
`python -m xwm_bridge.config_doc > docs/architecture/configuration.md`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from xwm_bridge.config import (
    BridgeConfig,
    Limits,
    MultiAgentConfig,
    ProviderConfig,
    ToolbridgeConfig,
)
from xwm_bridge.config_doc import DESCRIPTIONS, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture" / "configuration.md"


def test_every_key_is_described() -> None:
    nested = {"limits", "providers", "multi_agent", "toolbridge"}
    keys = {f.name for f in dataclasses.fields(BridgeConfig)} - nested
    keys |= {f"limits.{f.name}" for f in dataclasses.fields(Limits)}
    keys |= {f"providers[].{f.name}" for f in dataclasses.fields(ProviderConfig)}
    keys |= {f"multi_agent.{f.name}" for f in dataclasses.fields(MultiAgentConfig)}
    keys |= {f"toolbridge.{f.name}" for f in dataclasses.fields(ToolbridgeConfig)}
    assert keys == set(DESCRIPTIONS)


def test_committed_reference_matches_schema() -> None:
    assert DOC.read_text(encoding="utf-8") == render()
