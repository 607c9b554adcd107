"""The one routing resolver (routing.md §2–§5), used by ``xworkmate.routing.resolve``
and by every session turn.

:func:`resolve` is the algorithm with its I/O injected (memory preferences,
the LLM classifier, the skill finder/installer), so it is tested table-driven
without sockets; :class:`~xwm_bridge.router.service.Router` wires the real ones.

Deliberate fixes (routing.md §9): keyword predicates match tokens, not
substrings (see :mod:`keywords`); explicit targets are matched
case-insensitively (``singleAgent``, ``single-agent``, ``SINGLE_AGENT`` …) and
an unknown explicit target is an ``unavailable`` result with a clear message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.router import keywords
from xwm_bridge.router.memory import MemorySource, Preferences
from xwm_bridge.router.skills import (
    LOCAL_MATCH,
    NO_SKILLS,
    NONE,
    Finder,
    InstallApproval,
    Installer,
    SkillCandidate,
    candidate_from,
    resolve_skills,
)

SINGLE_AGENT = "single-agent"
MULTI_AGENT = "multi-agent"
GATEWAY = "gateway"
GATEWAY_PROVIDERS = ("local", "openclaw")
PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
UNKNOWN_TARGET = "UNKNOWN_EXECUTION_TARGET"

#: explicit target names, compared after lower-casing and dropping ``-``/``_``/spaces.
_EXPLICIT_TARGETS = {
    "multiagent": MULTI_AGENT,
    "singleagent": SINGLE_AGENT,
    "gateway": GATEWAY,
    "gatewaychat": GATEWAY,
}
_SEPARATORS = re.compile(r"[-_\s]+")

Classify = Callable[[str], Awaitable[str]]
NO_APPROVAL = InstallApproval()
#: ``routing.availableSkills`` items at most: each one's keywords are searched in the
#: whole prompt, on the event loop (20,000 of them with a 2 MB prompt held it for minutes)
MAX_AVAILABLE_SKILLS = 256


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """Typed view of the routing-relevant params (routing.md §1)."""

    prompt: str = ""
    working_directory: str = ""
    gateway_base_url: str = ""
    gateway_api_key: str = field(default="", repr=False)
    routing_mode: str = ""
    explicit_target: str = ""
    preferred_gateway: str = ""
    explicit_provider: str = ""
    explicit_model: str = ""
    explicit_skills: tuple[str, ...] = ()
    allow_install: bool = False
    approval: InstallApproval = field(default_factory=InstallApproval)
    available_skills: tuple[SkillCandidate, ...] = ()

    @classmethod
    def parse(
        cls,
        params: Mapping[str, Any],
        *,
        prompt: str | None = None,
        working_directory: str | None = None,
    ) -> RoutingRequest | None:
        """``None`` when ``params.routing`` is not a non-empty object.

        ``prompt`` and ``working_directory``: ``taskPrompt`` and ``workingDirectory``
        already coerced by the caller (``SessionParams``), not read again. A key that
        is absent is its field's default without a call (``text(None)`` is ``""``,
        ``loose_bool(None)`` false): a turn's routing object names few of them."""
        routing = params.get("routing")
        if not isinstance(routing, dict) or not routing:
            return None
        text = coerce.text
        get = routing.get
        approval = get("installApproval")
        skills = get("availableSkills")
        explicit_skills = get("explicitSkills")
        if isinstance(skills, list) and len(skills) > MAX_AVAILABLE_SKILLS:
            raise RpcError(
                INVALID_PARAMS,
                f"routing.availableSkills: at most {MAX_AVAILABLE_SKILLS} skills "
                f"(got {len(skills)})",
            )
        if prompt is None:
            prompt = text(params.get("taskPrompt"))
        if working_directory is None:
            working_directory = coerce.path_text(params.get("workingDirectory"), "workingDirectory")
        base_url = params.get("aiGatewayBaseUrl")
        api_key = params.get("aiGatewayApiKey")
        mode = get("routingMode")
        target = get("explicitExecutionTarget")
        gateway = get("preferredGatewayProviderId")
        provider = get("explicitProviderId")
        model = get("explicitModel")
        allow = get("allowSkillInstall")
        return cls(
            prompt=prompt,
            working_directory=working_directory,
            gateway_base_url="" if base_url is None else text(base_url),
            gateway_api_key="" if api_key is None else text(api_key),
            routing_mode="" if mode is None else text(mode),
            explicit_target="" if target is None else text(target),
            preferred_gateway="" if gateway is None else text(gateway),
            explicit_provider="" if provider is None else text(provider),
            explicit_model="" if model is None else text(model),
            explicit_skills=tuple(coerce.string_list(explicit_skills) or ())
            if explicit_skills is not None
            else (),
            allow_install=False if allow is None else coerce.loose_bool(allow),
            approval=InstallApproval(
                request_id=text(approval.get("requestId")),
                approved_keys=tuple(coerce.string_list(approval.get("approvedSkillKeys")) or ()),
            )
            if isinstance(approval, dict) and approval
            else NO_APPROVAL,
            available_skills=tuple(candidate_from(item) for item in skills)
            if isinstance(skills, list) and skills
            else (),
        )

    @property
    def explicit_mode(self) -> bool:
        return self.routing_mode.lower() == "explicit"

    @property
    def auto(self) -> bool:
        """Auto routing (memory is recorded only for these turns, §6.5)."""
        return not self.explicit_mode

    @property
    def gateway_provider(self) -> str:
        value = self.preferred_gateway.lower()
        return value if value in GATEWAY_PROVIDERS else "local"


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
    install_request_id: str = ""
    skill_candidates: tuple[SkillCandidate, ...] = ()
    memory_sources: tuple[MemorySource, ...] = ()
    #: how the target was chosen: explicit, keywords, classifier, memory, fallback.
    reason: str = ""

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
        if self.install_request_id:
            out["skillInstallRequestId"] = self.install_request_id
        if self.skill_candidates:
            out["skillCandidates"] = [c.wire() for c in self.skill_candidates]
        if self.memory_sources:
            out["memorySources"] = [s.wire() for s in self.memory_sources]
        return out


EMPTY_FIELDS: dict[str, Any] = RoutingDecision().fields()
NO_MEMORY = Preferences()


@functools.lru_cache(maxsize=64)
def _normalized(available: tuple[str, ...]) -> list[str]:
    """Provider ids, trimmed and lower-cased (the list comes from config: few distinct)."""
    return [p.strip().lower() for p in available if p.strip()]


async def _no_label(prompt: str) -> str:
    return ""


async def _no_install(approved: list[SkillCandidate]) -> list[SkillCandidate]:
    return []


#: explicit target values longer than this are mapped without the cache (which keeps
#: each value as its key: 256 of them the size of a request body held a GiB)
TARGET_CACHED_CHARS = 64


def explicit_target(value: str) -> str:
    """Map an explicit target name (case-insensitive); ``""`` when unknown."""
    if len(value) > TARGET_CACHED_CHARS:
        return _target_of(value)
    return _cached_target(value)


def _target_of(value: str) -> str:
    return _EXPLICIT_TARGETS.get(_SEPARATORS.sub("", value.strip().lower()), "")


_cached_target = functools.lru_cache(maxsize=256)(_target_of)


#: decisions without skills or memory (frozen: shared), by their strings; bounded,
#: since the model and the message hold client text: at most PLAIN_CACHED of them,
#: each kept only when its strings total at most PLAIN_KEY_CHARS characters (a model
#: or a quoted provider id can be as long as a request body: 256 such decisions would
#: hold a GiB)
_PLAIN: dict[tuple[str, ...], RoutingDecision] = {}
PLAIN_CACHED = 256
PLAIN_KEY_CHARS = 512


def _plain_decision(
    target: str,
    provider: str,
    gateway_provider: str,
    model: str,
    code: str,
    message: str,
    reason: str,
) -> RoutingDecision:
    """``RoutingDecision`` of a turn with no skills (``NO_SKILLS``) and no memory
    (``Preferences()``), made once per distinct set of strings: a frozen 13-field
    dataclass costs about 2 µs to build, a dict lookup a tenth of that."""
    key = (target, provider, gateway_provider, model, code, message, reason)
    hit = _PLAIN.get(key)
    if hit is None:
        hit = RoutingDecision(
            execution_target=target,
            provider_id=provider,
            gateway_provider_id=gateway_provider,
            model=model,
            skill_source=NONE,
            unavailable_code=code,
            unavailable_message=message,
            reason=reason,
        )
        if len(model) + len(message) + len(provider) <= PLAIN_KEY_CHARS:  # the client's
            if len(_PLAIN) >= PLAIN_CACHED:
                _PLAIN.clear()
            _PLAIN[key] = hit
    return hit


async def auto_target(
    prompt: str, memory: Preferences, available: list[str], classify: Classify
) -> tuple[str, str]:
    """§2.3 auto decision table → (target, reason)."""
    local = keywords.looks_local(prompt)
    online = keywords.looks_online(prompt)
    complex_ = keywords.looks_complex(prompt)
    if complex_ and (local or online):
        return MULTI_AGENT, "keywords"
    if local:
        return SINGLE_AGENT, "keywords"
    if online:
        return GATEWAY, "keywords"
    if complex_:
        return MULTI_AGENT, "keywords"
    label = await classify(prompt)
    if label in (GATEWAY, "gateway-chat"):
        return GATEWAY, "classifier"
    if label in (MULTI_AGENT, SINGLE_AGENT):
        return label, "classifier"
    preferred = memory.route.strip().lower()
    if preferred == GATEWAY:
        return GATEWAY, "memory"
    if preferred == MULTI_AGENT:
        return MULTI_AGENT, "memory"
    if preferred == SINGLE_AGENT and available:
        return SINGLE_AGENT, "memory"
    return (SINGLE_AGENT, "fallback") if available else (GATEWAY, "fallback")


async def resolve(
    req: RoutingRequest,
    available: list[str],
    *,
    memory: Preferences | None = None,
    classify: Classify = _no_label,
    finder: Finder | None = None,
    installer: Installer = _no_install,
) -> RoutingDecision:
    """Resolve a routing request against the available provider ids (§2)."""
    memory = memory or NO_MEMORY
    available_lc = _normalized(tuple(available))

    if req.explicit_mode and req.explicit_target:
        value = req.explicit_target  # explicit_target() inlined: the hot path's call
        short = len(value) <= TARGET_CACHED_CHARS
        target, reason = _cached_target(value) if short else _target_of(value), "explicit"
        if not target:
            return RoutingDecision(
                skill_source=NONE,
                unavailable_code=UNKNOWN_TARGET,
                unavailable_message=(
                    f"unknown explicit execution target {req.explicit_target!r}; "
                    "expected singleAgent, multiAgent or gateway"
                ),
                memory_sources=memory.sources,
                reason=reason,
            )
    else:
        target, reason = await auto_target(req.prompt, memory, available_lc, classify)
    gateway_provider = req.gateway_provider if target == GATEWAY else ""

    provider = code = message = ""
    explicit_provider = req.explicit_provider.lower()
    remembered = memory.provider.strip().lower()
    if explicit_provider:
        if explicit_provider in available_lc:
            provider = explicit_provider
        else:
            enabled = ", ".join(available_lc) if available_lc else "none enabled"
            if available_lc:
                enabled = f"enabled: {enabled}"
            code = PROVIDER_UNAVAILABLE
            message = f"explicit provider is unavailable: {req.explicit_provider!r} ({enabled})"
    elif remembered in available_lc and remembered:
        provider = remembered
    elif target == SINGLE_AGENT:
        if available_lc:
            provider = available_lc[0]
        else:
            code, message = PROVIDER_UNAVAILABLE, "no single-agent provider is available"

    skills = await resolve_skills(
        req.prompt,
        req.explicit_skills,
        list(req.available_skills),
        req.allow_install,
        req.approval,
        finder,
        installer,
    )
    model = req.explicit_model or memory.model
    if skills is NO_SKILLS and not memory.skills and not memory.sources:
        # the common turn: no skills, no memory file; its decision is a few strings
        return _plain_decision(target, provider, gateway_provider, model, code, message, reason)
    resolved_skills, source = skills.resolved, skills.source
    if not resolved_skills and memory.skills:
        resolved_skills = memory.skills
        if source in ("", NONE):
            source = LOCAL_MATCH
    return RoutingDecision(
        execution_target=target,
        provider_id=provider,
        gateway_provider_id=gateway_provider,
        model=model,
        skills=resolved_skills,
        skill_source=source or NONE,
        needs_skill_install=skills.needs_install,
        unavailable_code=code,
        unavailable_message=message,
        install_request_id=skills.install_request_id,
        skill_candidates=skills.candidates,
        memory_sources=memory.sources,
        reason=reason,
    )
