"""Routing as ACP session config options (sans-I/O): the ``route`` and ``model`` selects.

Route values: ``auto``; ``single-agent:<provider id>`` for each available
provider; ``multi-agent`` when enabled; ``gateway:<local|openclaw>``. The
``route`` option is also offered as the session's ``modes`` (older clients), kept
in sync. ``model`` is offered when the chosen route lists models (a provider's
``models``); its ``default`` value lets the router decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.config import BridgeConfig
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError

ROUTE = "route"
MODEL = "model"
DEFAULT_MODEL = "default"
#: ``_meta`` keys of ``session/new`` for clients that cannot set options
META_ROUTE = "xwm-bridge/route"
META_MODEL = "xwm-bridge/model"
GATEWAYS = (("local", "Local gateway"), ("openclaw", "OpenClaw"))


@dataclass(frozen=True, slots=True)
class Route:
    value: str
    name: str
    description: str
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Choice:
    """A session's current route and model (``""`` = the router's choice)."""

    route: str
    model: str = ""


class RouteCatalog:
    """Every route this bridge offers, from its config."""

    def __init__(self, config: BridgeConfig) -> None:
        routes = [Route("auto", "Auto", "The bridge's router picks the target for each prompt")]
        for p in config.available_providers:
            kind = "local agent" if p.is_stdio else "ACP provider"
            routes.append(
                Route(f"single-agent:{p.id}", p.label or p.id, f"{kind} {p.id}", tuple(p.models))
            )
        routes.append(
            Route(
                "multi-agent", "Multi-agent", "Planner, workers and reviewer on the bridge's model"
            )
        )
        for gid, label in GATEWAYS:
            routes.append(Route(f"gateway:{gid}", label, f"{label} runtime ({gid})"))
        self.routes = {r.value.lower(): r for r in routes}
        default = config.acp.default_route.lower()
        self.default = self.routes[default].value if default in self.routes else "auto"

    def route(self, value: str) -> Route:
        route = self.routes.get(value.strip().lower())
        if route is None:
            raise RpcError(
                INVALID_PARAMS,
                f"unknown route {value!r}; expected one of {', '.join(self.routes_values())}",
            )
        return route

    def routes_values(self) -> list[str]:
        return [r.value for r in self.routes.values()]

    def check(self, choice: Choice) -> Choice:
        """A valid choice: the route exists; the model is one the route lists."""
        route = self.route(choice.route)
        model = choice.model
        if model in ("", DEFAULT_MODEL):
            model = ""
        elif model not in route.models:
            raise RpcError(
                INVALID_PARAMS,
                f"model {model!r} is not offered by route {route.value}"
                + (f"; expected one of {', '.join(route.models)}" if route.models else ""),
            )
        return Choice(route.value, model)

    def set(self, choice: Choice, config_id: str, value: Any) -> Choice:
        """``session/set_config_option``: the new choice (a route change resets the model
        unless the new route also lists it)."""
        if not isinstance(value, str) or not value:
            raise RpcError(INVALID_PARAMS, "value must be a non-empty string")
        if config_id == ROUTE:
            route = self.route(value)
            model = choice.model if choice.model in route.models else ""
            return Choice(route.value, model)
        if config_id == MODEL:
            return self.check(replace(choice, model=value))
        raise RpcError(INVALID_PARAMS, f"unknown configId {config_id!r}; expected route or model")

    def from_meta(self, meta: Any) -> Choice:
        """The initial choice of ``session/new``: config default, overridden by ``_meta``."""
        choice = Choice(self.default)
        if not isinstance(meta, Mapping):
            return choice
        route = coerce.text(meta.get(META_ROUTE))
        if route:
            choice = Choice(self.route(route).value)
        model = coerce.text(meta.get(META_MODEL))
        if model:
            choice = self.check(replace(choice, model=model))
        return choice

    # --- wire shapes ---------------------------------------------------------------

    def config_options(self, choice: Choice) -> list[dict[str, Any]]:
        route = self.route(choice.route)
        options: list[dict[str, Any]] = [
            {
                "id": ROUTE,
                "name": "Route",
                "description": "Where the bridge sends this session's prompts",
                "category": "mode",
                "type": "select",
                "currentValue": route.value,
                "options": [
                    {"value": r.value, "name": r.name, "description": r.description}
                    for r in self.routes.values()
                ],
            }
        ]
        if route.models:
            options.append(
                {
                    "id": MODEL,
                    "name": "Model",
                    "category": "model",
                    "type": "select",
                    "currentValue": choice.model or DEFAULT_MODEL,
                    "options": [
                        {
                            "value": DEFAULT_MODEL,
                            "name": "Default",
                            "description": "The router's choice",
                        },
                        *({"value": m, "name": m} for m in route.models),
                    ],
                }
            )
        return options

    def modes(self, choice: Choice) -> dict[str, Any]:
        return {
            "currentModeId": self.route(choice.route).value,
            "availableModes": [
                {"id": r.value, "name": r.name, "description": r.description}
                for r in self.routes.values()
            ],
        }

    def state(self, choice: Choice) -> dict[str, Any]:
        """``configOptions`` and ``modes`` of a session setup response."""
        return {"configOptions": self.config_options(choice), "modes": self.modes(choice)}
