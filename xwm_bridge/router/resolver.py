"""Routing decision for a turn (routing.md §2, §5).

This build implements explicit routing in full (§2.3 explicit table, §2.4
provider rules, explicit model and skills). Auto routing uses only the spec's
final fallback — the first available provider, single-agent, else gateway —
until the keyword/LLM classifier, memory and skill finder land; see README.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce

SINGLE_AGENT = "single-agent"
MULTI_AGENT = "multi-agent"
GATEWAY = "gateway"
GATEWAY_PROVIDERS = ("local", "openclaw")
PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"

_EXPLICIT_TARGETS = {
    "multiAgent": MULTI_AGENT,
    "multi-agent": MULTI_AGENT,
    "singleAgent": SINGLE_AGENT,
    "single-agent": SINGLE_AGENT,
    "gateway": GATEWAY,
}


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    execution_target: str = ""
    provider_id: str = ""
    gateway_provider_id: str = ""
    model: str = ""
    skills: tuple[str, ...] = ()
    skill_source: str = ""
    needs_skill_install: bool = False
    unavailable_code: str = ""
    unavailable_message: str = ""

    @property
    def unavailable(self) -> bool:
        return bool(self.unavailable_code)

    def fields(self) -> dict[str, Any]:
        """The routing output fields, exactly as §5 spells them."""
        out: dict[str, Any] = {
            "resolvedExecutionTarget": self.execution_target,
            "resolvedProviderId": self.provider_id,
            "resolvedGatewayProviderId": self.gateway_provider_id,
            "resolvedModel": self.model,
            "resolvedSkills": list(self.skills) if self.skills else None,
            "skillResolutionSource": self.skill_source,
            "needsSkillInstall": self.needs_skill_install,
            "unavailable": self.unavailable,
        }
        if self.unavailable_code:
            out["unavailableCode"] = self.unavailable_code
        if self.unavailable_message:
            out["unavailableMessage"] = self.unavailable_message
        return out


def _gateway_provider(routing: dict[str, Any]) -> str:
    value = coerce.text(routing.get("preferredGatewayProviderId")).lower()
    return value if value in GATEWAY_PROVIDERS else "local"


def _dedupe(values: list[str]) -> tuple[str, ...]:
    seen: set[str] = set()
    out: list[str] = []
    for v in values:
        key = v.lower()
        if v and key not in seen:
            seen.add(key)
            out.append(v)
    return tuple(out)


def resolve(routing: dict[str, Any], available: list[str]) -> RoutingDecision:
    """Resolve a non-empty ``routing`` object against the available provider ids."""
    available_lc = [p.strip().lower() for p in available]
    mode = coerce.text(routing.get("routingMode")).lower()
    explicit_target = coerce.text(routing.get("explicitExecutionTarget"))

    if mode == "explicit" and explicit_target:
        target = _EXPLICIT_TARGETS.get(explicit_target, SINGLE_AGENT)
    else:
        target = SINGLE_AGENT if available_lc else GATEWAY
    gateway_provider = _gateway_provider(routing) if target == GATEWAY else ""

    provider = ""
    code = message = ""
    explicit_provider = coerce.text(routing.get("explicitProviderId")).lower()
    if explicit_provider:
        if explicit_provider in available_lc:
            provider = explicit_provider
        else:
            code, message = PROVIDER_UNAVAILABLE, "explicit provider is unavailable"
    elif target == SINGLE_AGENT:
        if available_lc:
            provider = available_lc[0]
        else:
            code, message = PROVIDER_UNAVAILABLE, "no single-agent provider is available"

    skills = _dedupe(coerce.string_list(routing.get("explicitSkills")) or [])
    return RoutingDecision(
        execution_target=target,
        provider_id=provider,
        gateway_provider_id=gateway_provider,
        model=coerce.text(routing.get("explicitModel")),
        skills=skills,
        skill_source="local_match" if skills else "none",
        unavailable_code=code,
        unavailable_message=message,
    )
