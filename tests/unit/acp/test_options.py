"""Routing as session config options: the route/model selects, their changes, ``_meta``."""

from __future__ import annotations

import pytest
from acp import schema

from tests.acp_schema import strict
from xwm_bridge.acp.options import Choice, RouteCatalog
from xwm_bridge.config import load_config
from xwm_bridge.jsonrpc import RpcError


def catalog(**acp: str) -> RouteCatalog:
    doc = {
        "providers": [
            {
                "id": "codex",
                "label": "Codex",
                "endpoint": "http://127.0.0.1:1/acp/rpc",
                "models": ["gpt-a", "gpt-b"],
            },
            {"id": "fake", "kind": "stdio", "command": ["agent"]},
            {"id": "off", "endpoint": "http://127.0.0.1:1", "enabled": False},
        ],
        "acp": acp,
    }
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(doc, fh)
    return RouteCatalog(load_config(config_file=fh.name, env={}).config)


def test_routes_from_config_and_the_default() -> None:
    cat = catalog()
    assert cat.routes_values() == [
        "auto",
        "single-agent:codex",
        "single-agent:fake",
        "multi-agent",
        "gateway:local",
        "gateway:openclaw",
    ]
    assert cat.default == "auto"
    assert catalog(default_route="single-agent:fake").default == "single-agent:fake"


def test_config_options_and_modes_follow_the_choice() -> None:
    cat = catalog()
    auto = cat.state(Choice("auto"))
    strict(schema.NewSessionResponse, {"sessionId": "s", **auto})
    assert [o["id"] for o in auto["configOptions"]] == ["route"]  # auto lists no models
    assert auto["modes"]["currentModeId"] == "auto"
    codex = cat.state(Choice("single-agent:codex", "gpt-b"))
    strict(schema.SetSessionConfigOptionResponse, {"configOptions": codex["configOptions"]})
    model = codex["configOptions"][1]
    assert model["id"] == "model" and model["currentValue"] == "gpt-b"
    assert [o["value"] for o in model["options"]] == ["default", "gpt-a", "gpt-b"]


def test_set_route_and_model() -> None:
    cat = catalog()
    choice = cat.set(Choice("auto"), "route", "single-agent:codex")
    assert choice == Choice("single-agent:codex")
    choice = cat.set(choice, "model", "gpt-a")
    assert choice == Choice("single-agent:codex", "gpt-a")
    assert cat.set(choice, "model", "default") == Choice("single-agent:codex")
    assert cat.set(choice, "route", "multi-agent") == Choice("multi-agent")  # model reset
    for config_id, value in (
        ("route", "single-agent:off"),
        ("route", ""),
        ("model", "gpt-z"),
        ("color", "red"),
        ("route", 3),
    ):
        with pytest.raises(RpcError) as err:
            cat.set(choice, config_id, value)
        assert err.value.code == -32602


def test_meta_on_session_new() -> None:
    cat = catalog()
    assert cat.from_meta(None) == Choice("auto")
    assert cat.from_meta(
        {"xwm-bridge/route": "single-agent:codex", "xwm-bridge/model": "gpt-b"}
    ) == Choice("single-agent:codex", "gpt-b")
    with pytest.raises(RpcError):
        cat.from_meta({"xwm-bridge/route": "nowhere"})
    with pytest.raises(RpcError):
        cat.from_meta({"xwm-bridge/model": "gpt-a"})  # auto lists no models


def test_default_route_is_validated() -> None:
    from xwm_bridge.config import ConfigError

    with pytest.raises(ConfigError, match=r"acp\.default_route"):
        catalog(default_route="single-agent:nope")
    with pytest.raises(ConfigError, match=r"acp\.default_route"):
        catalog(default_route="somewhere")
