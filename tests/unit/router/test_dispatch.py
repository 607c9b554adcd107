"""xworkmate.dispatch.resolve (routing.md §8), including the spec's examples."""

from __future__ import annotations

from typing import Any

import pytest

from xwm_bridge.router.dispatch import resolve_dispatch

CODEX = {
    "id": "codex",
    "name": "Codex CLI",
    "defaultArgs": ["app-server"],
    "capabilities": ["chat", "gateway-bridge"],
}
QWEN = {"id": "qwen", "name": "Qwen", "capabilities": ["chat"]}
EXAMPLE: dict[str, Any] = {
    "providers": [CODEX, QWEN],
    "preferredProviderId": "codex",
    "requiredCapabilities": ["gateway-bridge"],
    "nodeState": {
        "selectedAgentId": "main",
        "gatewayConnected": True,
        "executionTarget": "local",
        "runtimeMode": "externalCli",
        "bridgeEnabled": True,
        "bridgeState": "registered",
        "resolvedCodexCliPath": "/opt/homebrew/bin/codex",
    },
    "nodeInfo": {"id": "xworkmate-app", "name": "XWorkmate", "version": "1.0.0"},
}


def test_example_12() -> None:
    assert resolve_dispatch(EXAMPLE) == {
        "providerId": "codex",
        "provider": CODEX,
        "agentId": "main",
        "metadata": {
            "node": {
                "id": "xworkmate-app",
                "name": "XWorkmate",
                "version": "1.0.0",
                "kind": "app-mediated-cooperative-node",
                "gatewayTransport": "websocket-rpc",
            },
            "dispatch": {"mode": "cooperative", "executionTarget": "local"},
            "bridge": {
                "enabled": True,
                "state": "registered",
                "gatewayConnected": True,
                "runtimeMode": "externalCli",
                "localTransport": "stdio-jsonrpc",
                "binaryConfigured": True,
            },
            "provider": CODEX,
        },
    }


def test_without_node_state() -> None:
    params = {k: v for k, v in EXAMPLE.items() if k not in ("nodeState",)}
    assert resolve_dispatch(params) == {"metadata": {}, "providerId": "codex", "provider": CODEX}


def test_qwen_only_has_null_default_args() -> None:
    out = resolve_dispatch({"providers": [QWEN]})
    assert out["provider"] == {"id": "qwen", "name": "Qwen", "defaultArgs": None,
                               "capabilities": ["chat"]}  # fmt: skip


def test_sorting_preference_and_capabilities() -> None:
    providers = [
        {"id": "b", "capabilities": ["X"]},
        {"id": "a"},
        {"id": "B", "capabilities": ["x"]},
    ]
    assert resolve_dispatch({"providers": providers})["providerId"] == "B"  # byte order
    required = {"providers": providers, "requiredCapabilities": [" x "]}
    assert resolve_dispatch(required)["providerId"] == "B"
    assert resolve_dispatch({**required, "preferredProviderId": "b"})["providerId"] == "b"
    # the preferred id is case-sensitive; an unsupported preference is ignored
    assert resolve_dispatch({**required, "preferredProviderId": "A"})["providerId"] == "B"
    assert resolve_dispatch({**required, "requiredCapabilities": ["y"]}) == {"metadata": {}}


def test_defaults_and_builtin_runtime() -> None:
    out = resolve_dispatch({"nodeState": {"runtimeMode": "builtIn", "bridgeEnabled": "no"}})
    assert out == {
        "metadata": {
            "node": {
                "id": "xworkmate-app",
                "name": "XWorkmate",
                "version": "",
                "kind": "app-mediated-cooperative-node",
                "gatewayTransport": "websocket-rpc",
            },
            "dispatch": {"mode": "gateway-only", "executionTarget": ""},
            "bridge": {
                "enabled": False,
                "state": "",
                "gatewayConnected": False,
                "runtimeMode": "builtIn",
                "localTransport": "ffi-runtime",
            },
        }
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("providers", "codex"),
        ("providers", {"id": "codex"}),
        ("providers", [1, None, "x", {"id": ""}, {"id": {"a": 1}}]),
        ("preferredProviderId", ["codex"]),
        ("requiredCapabilities", "chat"),
        ("requiredCapabilities", [1, None]),
        ("nodeState", "yes"),
        ("nodeState", {"selectedAgentId": 5, "gatewayConnected": "maybe", "bridgeEnabled": 1}),
        ("nodeInfo", [1]),
        ("nodeInfo", {"id": None, "name": 3, "version": 1.5}),
    ],
)
def test_wrong_types_are_coerced(field: str, value: Any) -> None:
    out = resolve_dispatch({"providers": [QWEN], field: value})
    assert isinstance(out["metadata"], dict)
