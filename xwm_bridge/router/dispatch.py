"""``xworkmate.dispatch.resolve`` (routing.md §8): a pure provider choice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce


@dataclass(frozen=True, slots=True)
class DispatchProvider:
    id: str
    name: str
    default_args: list[str] | None
    capabilities: list[str] | None

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "defaultArgs": self.default_args,
            "capabilities": self.capabilities,
        }

    def supports(self, required: set[str]) -> bool:
        have = {c.strip().lower() for c in self.capabilities or []}
        return required <= have


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    providers: tuple[DispatchProvider, ...]
    preferred: str
    required: frozenset[str]
    node_state: dict[str, Any] | None
    node_info: dict[str, Any]

    @classmethod
    def parse(cls, params: dict[str, Any]) -> DispatchRequest:
        raw = params.get("providers")
        providers = []
        for item in raw if isinstance(raw, list) else []:
            if not isinstance(item, dict):
                continue
            pid = coerce.text(item.get("id"))
            if not pid:
                continue
            providers.append(
                DispatchProvider(
                    id=pid,
                    name=coerce.text(item.get("name")),
                    default_args=coerce.string_list(item.get("defaultArgs")),
                    capabilities=coerce.string_list(item.get("capabilities")),
                )
            )
        required = {c.lower() for c in coerce.string_list(params.get("requiredCapabilities")) or []}
        state = params.get("nodeState")
        info = params.get("nodeInfo")
        return cls(
            providers=tuple(providers),
            preferred=coerce.text(params.get("preferredProviderId")),
            required=frozenset(required),
            node_state=state if isinstance(state, dict) else None,
            node_info=info if isinstance(info, dict) else {},
        )


def choose(req: DispatchRequest) -> DispatchProvider | None:
    supporting = [p for p in req.providers if p.supports(set(req.required))]
    if req.preferred:
        for p in supporting:
            if p.id == req.preferred:
                return p
    supporting.sort(key=lambda p: p.id.encode())
    return supporting[0] if supporting else None


def _metadata(req: DispatchRequest, chosen: DispatchProvider | None) -> dict[str, Any]:
    state = req.node_state
    if state is None:
        return {}
    info = req.node_info
    enabled = coerce.flag(state.get("bridgeEnabled"), False)
    runtime_mode = coerce.text(state.get("runtimeMode"))
    bridge: dict[str, Any] = {
        "enabled": enabled,
        "state": coerce.text(state.get("bridgeState")),
        "gatewayConnected": coerce.flag(state.get("gatewayConnected"), False),
        "runtimeMode": runtime_mode,
        "localTransport": "ffi-runtime" if runtime_mode == "builtIn" else "stdio-jsonrpc",
    }
    if coerce.text(state.get("resolvedCodexCliPath")) or coerce.text(
        state.get("configuredCodexCliPath")
    ):
        bridge["binaryConfigured"] = True
    out: dict[str, Any] = {
        "node": {
            "id": coerce.text(info.get("id"), "xworkmate-app"),
            "name": coerce.text(info.get("name"), "XWorkmate"),
            "version": coerce.text(info.get("version")),
            "kind": "app-mediated-cooperative-node",
            "gatewayTransport": "websocket-rpc",
        },
        "dispatch": {
            "mode": "cooperative" if enabled else "gateway-only",
            "executionTarget": coerce.text(state.get("executionTarget")),
        },
        "bridge": bridge,
    }
    if chosen is not None:
        out["provider"] = chosen.wire()
    return out


def resolve_dispatch(params: dict[str, Any]) -> dict[str, Any]:
    req = DispatchRequest.parse(params)
    chosen = choose(req)
    out: dict[str, Any] = {"metadata": _metadata(req, chosen)}
    if chosen is not None:
        out["providerId"] = chosen.id
        out["provider"] = chosen.wire()
    if req.node_state is not None:
        agent = coerce.text(req.node_state.get("selectedAgentId"))
        if agent:
            out["agentId"] = agent
    return out
