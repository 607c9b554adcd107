"""The typed turn: parsed params, routing decision, mode and upstream params, built once.

A :class:`TurnRequest` is made at the head of the thread queue, after routing,
and handed read-only to the executor of its :class:`~xwm_bridge.core.modes.Mode`.
Nothing downstream re-parses the client's params or copies them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.core.modes import Mode
from xwm_bridge.core.params import SessionParams
from xwm_bridge.router.resolver import RoutingDecision, RoutingRequest

#: client keys never given to an upstream, agent or gateway (forwarding.md §4.2).
STRIPPED_KEYS = frozenset(
    {
        "metadata",
        "resolvedExecutionTarget",
        "resolvedProviderId",
        "resolvedGatewayProviderId",
        "resolvedModel",
        "resolvedSkills",
        "bridgeAuthorizationHeader",
        "executionTarget",
        "agentId",
        "acpPrompt",  # an ACP client's content blocks: for stdio agents only (may be large)
    }
)


def upstream_params(
    raw: Mapping[str, Any], decision: RoutingDecision, mode: Mode
) -> dict[str, Any]:
    """§3.4 + §4.2 in one copy: the client's params without the stripped keys, with
    ``mode`` and the non-empty routing choices (``provider``, ``gatewayProvider``,
    ``model``, ``selectedSkills``) set. The ``resolved*`` routing fields go into the
    turn's result, never upstream, so they are not added here at all."""
    out = {k: v for k, v in raw.items() if k not in STRIPPED_KEYS}
    out["mode"] = mode.value
    if decision.provider_id:
        out["provider"] = decision.provider_id
    if decision.gateway_provider_id:
        out["gatewayProvider"] = decision.gateway_provider_id
    if decision.model:
        out["model"] = decision.model
    if decision.skills:
        out["selectedSkills"] = list(decision.skills)
    return out


@dataclass(frozen=True, slots=True)
class TurnRequest:
    #: ``session.start`` or ``session.message`` (also the upstream method)
    method: str
    params: SessionParams
    routing: RoutingRequest
    decision: RoutingDecision
    mode: Mode
    #: what the executor sends on (see :func:`upstream_params`); treat as read-only
    upstream: Mapping[str, Any] = field(repr=False)  # credentials: never in a repr
    #: who asked (transport-derived, e.g. a digest of the bearer); owns gateway runtimes
    principal: str = ""

    @classmethod
    def build(
        cls,
        method: str,
        params: SessionParams,
        routing: RoutingRequest,
        decision: RoutingDecision,
        principal: str = "",
    ) -> TurnRequest:
        mode = Mode.of_target(decision.execution_target)
        return cls(
            method=method,
            params=params,
            routing=routing,
            decision=decision,
            mode=mode,
            upstream=upstream_params(params.raw, decision, mode),
            principal=principal,
        )

    @property
    def provider(self) -> str:
        """The routed provider id, else the client's ``provider`` param (may be empty)."""
        return coerce.text(self.upstream.get("provider"))

    @property
    def prompt(self) -> str:
        return self.params.task_prompt

    @property
    def working_directory(self) -> str:
        return self.params.working_directory
