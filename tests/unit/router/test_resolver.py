"""xwm_bridge.router.resolver: explicit routing (routing.md §2.3, §2.4) and output fields (§5)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.router import resolver
from xwm_bridge.router.resolver import (
    GATEWAY,
    MULTI_AGENT,
    PROVIDER_UNAVAILABLE,
    SINGLE_AGENT,
    RoutingDecision,
    RoutingRequest,
)
from xwm_bridge.router.resolver import resolve as resolve_async
from xwm_bridge.router.skills import NONE, SkillResult

PROPS = settings(max_examples=200, deadline=None)
CATALOG = ["codex", "opencode", "gemini"]


def resolve(routing: dict[str, Any], available: list[str]) -> RoutingDecision:
    req = RoutingRequest.parse({"routing": routing}) or RoutingRequest()
    return asyncio.run(resolve_async(req, available))


def explicit(target: str, **extra: Any) -> dict[str, Any]:
    return {"routingMode": "explicit", "explicitExecutionTarget": target, **extra}


# --- execution target -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("multiAgent", MULTI_AGENT),
        ("multi-agent", MULTI_AGENT),
        ("singleAgent", SINGLE_AGENT),
        ("single-agent", SINGLE_AGENT),
        ("gateway", GATEWAY),
        ("  gateway  ", GATEWAY),  # trimmed
        # fix (routing.md §9.3): names are matched case-insensitively
        ("gateway-chat", GATEWAY),
        ("Gateway", GATEWAY),
        ("GATEWAY_CHAT", GATEWAY),
        ("SingleAgent", SINGLE_AGENT),
        ("SINGLE-AGENT", SINGLE_AGENT),
        ("MultiAgent", MULTI_AGENT),
        ("multi_agent", MULTI_AGENT),
        ("Multi Agent", MULTI_AGENT),
    ],
)
def test_explicit_target_table(target: str, expected: str) -> None:
    decision = resolve(explicit(target), CATALOG)
    assert decision.execution_target == expected
    assert not decision.unavailable


@pytest.mark.parametrize("target", ["auto", "single", "agent", "gateways", "multi-agents", "42"])
def test_unknown_explicit_target_is_unavailable(target: str) -> None:
    decision = resolve(explicit(target, explicitProviderId="codex"), CATALOG)
    fields = decision.fields()
    assert fields["unavailable"] is True
    assert fields["unavailableCode"] == "UNKNOWN_EXECUTION_TARGET"
    assert repr(target) in fields["unavailableMessage"]
    assert fields["resolvedExecutionTarget"] == ""
    assert fields["resolvedProviderId"] == ""


def test_routing_mode_is_case_insensitive() -> None:
    assert resolve(explicit("gateway", routingMode="EXPLICIT"), CATALOG).execution_target == GATEWAY
    assert (
        resolve(explicit("gateway", routingMode=" Explicit "), CATALOG).execution_target == GATEWAY
    )


@pytest.mark.parametrize("target", ["", "   ", None])
def test_explicit_mode_without_target_falls_back_to_auto(target: Any) -> None:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": target}
    assert resolve(routing, CATALOG).execution_target == SINGLE_AGENT
    assert resolve(routing, []).execution_target == GATEWAY


@pytest.mark.parametrize("mode", ["auto", "", "whatever", None])
def test_non_explicit_mode_ignores_explicit_target(mode: Any) -> None:
    routing = {"routingMode": mode, "explicitExecutionTarget": "multiAgent"}
    assert resolve(routing, CATALOG).execution_target == SINGLE_AGENT


def test_auto_fallback_first_available_provider() -> None:
    decision = resolve({"routingMode": "auto"}, CATALOG)
    assert decision.execution_target == SINGLE_AGENT
    assert decision.provider_id == "codex"
    assert not decision.unavailable
    assert resolve({"routingMode": "auto"}, ["gemini", "codex"]).provider_id == "gemini"


def test_auto_without_providers_goes_to_gateway() -> None:
    decision = resolve({"routingMode": "auto", "preferredGatewayProviderId": "openclaw"}, [])
    assert decision.execution_target == GATEWAY
    assert decision.gateway_provider_id == "openclaw"
    assert decision.provider_id == ""
    assert not decision.unavailable


# --- gateway provider -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "expected"),
    [
        (None, "local"),
        ("", "local"),
        ("local", "local"),
        ("openclaw", "openclaw"),
        ("OpenClaw", "openclaw"),
        (" OPENCLAW ", "openclaw"),
        ("LOCAL", "local"),
        ("codex", "local"),
        ("remote", "local"),
        (1, "local"),
    ],
)
def test_gateway_provider(preferred: Any, expected: str) -> None:
    routing = explicit("gateway", preferredGatewayProviderId=preferred)
    assert resolve(routing, CATALOG).gateway_provider_id == expected


@pytest.mark.parametrize("target", ["singleAgent", "multiAgent"])
def test_gateway_provider_empty_for_other_targets(target: str) -> None:
    routing = explicit(target, preferredGatewayProviderId="openclaw")
    assert resolve(routing, CATALOG).gateway_provider_id == ""


# --- provider -------------------------------------------------------------------------


def test_explicit_provider_available() -> None:
    decision = resolve(explicit("singleAgent", explicitProviderId="opencode"), CATALOG)
    assert decision.provider_id == "opencode"
    assert not decision.unavailable
    assert decision.unavailable_code == ""
    assert decision.unavailable_message == ""


def test_explicit_provider_is_lower_cased_and_trimmed() -> None:
    decision = resolve(explicit("singleAgent", explicitProviderId="  GeMiNi "), CATALOG)
    assert decision.provider_id == "gemini"


def test_available_list_is_normalized() -> None:
    decision = resolve(explicit("singleAgent", explicitProviderId="codex"), [" Codex "])
    assert decision.provider_id == "codex"
    assert resolve({"routingMode": "auto"}, [" Codex "]).provider_id == "codex"


def test_explicit_provider_unavailable() -> None:
    decision = resolve(explicit("singleAgent", explicitProviderId="claude"), CATALOG)
    assert decision.unavailable
    assert decision.unavailable_code == "PROVIDER_UNAVAILABLE"
    assert decision.unavailable_code == PROVIDER_UNAVAILABLE
    # issue 15 item 5: the message names the id (and what is enabled)
    assert decision.unavailable_message == (
        "explicit provider is unavailable: 'claude' (enabled: " + ", ".join(CATALOG) + ")"
    )
    assert decision.provider_id == ""
    assert decision.execution_target == SINGLE_AGENT


@pytest.mark.parametrize("target", ["gateway", "multiAgent"])
def test_explicit_provider_applies_to_every_target(target: str) -> None:
    ok = resolve(explicit(target, explicitProviderId="codex"), CATALOG)
    assert ok.provider_id == "codex" and not ok.unavailable
    bad = resolve(explicit(target, explicitProviderId="nope"), CATALOG)
    assert bad.unavailable_message.startswith("explicit provider is unavailable: 'nope' ")
    none = resolve(explicit(target, explicitProviderId="nope"), [])
    assert none.unavailable_message == "explicit provider is unavailable: 'nope' (none enabled)"


def test_explicit_provider_in_auto_mode() -> None:
    decision = resolve({"routingMode": "auto", "explicitProviderId": "gemini"}, CATALOG)
    assert decision.provider_id == "gemini"
    bad = resolve({"routingMode": "auto", "explicitProviderId": "nope"}, CATALOG)
    assert bad.unavailable


def test_single_agent_without_providers_is_unavailable() -> None:
    decision = resolve(explicit("singleAgent"), [])
    assert decision.unavailable
    assert decision.unavailable_code == "PROVIDER_UNAVAILABLE"
    assert decision.unavailable_message == "no single-agent provider is available"
    assert decision.provider_id == ""


def test_explicit_single_agent_without_provider_picks_first() -> None:
    assert resolve(explicit("single-agent"), CATALOG).provider_id == "codex"


@pytest.mark.parametrize("target", ["gateway", "multiAgent"])
def test_non_single_agent_targets_get_no_default_provider(target: str) -> None:
    decision = resolve(explicit(target), CATALOG)
    assert decision.provider_id == ""
    assert not decision.unavailable
    assert not resolve(explicit(target), []).unavailable


# --- model and skills -----------------------------------------------------------------


def test_explicit_model() -> None:
    assert resolve(explicit("singleAgent", explicitModel="  gpt-5  "), CATALOG).model == "gpt-5"
    assert resolve(explicit("singleAgent"), CATALOG).model == ""
    assert resolve(explicit("singleAgent", explicitModel=4), CATALOG).model == "4"


def test_explicit_skills_deduped() -> None:
    routing = explicit("singleAgent", explicitSkills=[" pptx ", "PPTX", "", None, "docx", "pptx"])
    decision = resolve(routing, CATALOG)
    assert decision.skills == ("pptx", "docx")
    assert decision.skill_source == "local_match"
    assert decision.fields()["resolvedSkills"] == ["pptx", "docx"]


def test_first_spelling_wins_in_dedupe() -> None:
    decision = resolve(explicit("singleAgent", explicitSkills=["Docx", "docx"]), CATALOG)
    assert decision.skills == ("Docx",)


@pytest.mark.parametrize("skills", [None, [], ["", "  "], "pptx", {"a": 1}])
def test_no_skills(skills: Any) -> None:
    decision = resolve(explicit("singleAgent", explicitSkills=skills), CATALOG)
    assert decision.skills == ()
    assert decision.skill_source == "none"
    assert decision.needs_skill_install is False


# --- output fields --------------------------------------------------------------------


def test_fields_shape_when_available() -> None:
    fields = resolve(explicit("singleAgent", explicitProviderId="opencode"), CATALOG).fields()
    assert fields == {
        "resolvedExecutionTarget": "single-agent",
        "resolvedProviderId": "opencode",
        "resolvedGatewayProviderId": "",
        "resolvedModel": "",
        "resolvedSkills": None,
        "skillResolutionSource": "none",
        "needsSkillInstall": False,
        "unavailable": False,
    }


def test_fields_shape_when_unavailable() -> None:
    fields = resolve(explicit("singleAgent", explicitProviderId="claude"), CATALOG).fields()
    assert fields == {
        "resolvedExecutionTarget": "single-agent",
        "resolvedProviderId": "",
        "resolvedGatewayProviderId": "",
        "resolvedModel": "",
        "resolvedSkills": None,
        "skillResolutionSource": "none",
        "needsSkillInstall": False,
        "unavailable": True,
        "unavailableCode": "PROVIDER_UNAVAILABLE",
        "unavailableMessage": "explicit provider is unavailable: 'claude' (enabled: "
        + ", ".join(CATALOG)
        + ")",
    }


def test_fields_gateway_with_skills_and_model() -> None:
    routing = explicit(
        "gateway",
        preferredGatewayProviderId="openclaw",
        explicitModel="m",
        explicitSkills=["a"],
    )
    fields = resolve(routing, CATALOG).fields()
    assert fields["resolvedExecutionTarget"] == "gateway"
    assert fields["resolvedGatewayProviderId"] == "openclaw"
    assert fields["resolvedModel"] == "m"
    assert fields["resolvedSkills"] == ["a"]
    assert fields["skillResolutionSource"] == "local_match"
    assert "unavailableCode" not in fields and "unavailableMessage" not in fields


def test_fields_returns_fresh_list() -> None:
    decision = RoutingDecision(skills=("a",))
    first = decision.fields()
    first["resolvedSkills"].append("mutated")
    assert decision.fields()["resolvedSkills"] == ["a"]


def test_default_decision() -> None:
    decision = RoutingDecision()
    assert not decision.unavailable
    assert decision.fields()["resolvedSkills"] is None
    assert "unavailableCode" not in decision.fields()


@PROPS
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "routingMode",
                "explicitExecutionTarget",
                "explicitProviderId",
                "preferredGatewayProviderId",
                "explicitModel",
                "explicitSkills",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.text(max_size=12),
            st.sampled_from(["explicit", "gateway", "multiAgent", "codex", "openclaw"]),
            st.lists(st.text(max_size=5), max_size=3),
        ),
    ),
    st.lists(st.sampled_from(CATALOG), unique=True),
)
def test_resolve_invariants(routing: dict[str, Any], available: list[str]) -> None:
    decision = resolve(routing, available)
    fields = decision.fields()
    if fields.get("unavailableCode") == "UNKNOWN_EXECUTION_TARGET":
        assert fields["resolvedExecutionTarget"] == ""
        return
    assert fields["resolvedExecutionTarget"] in (SINGLE_AGENT, MULTI_AGENT, GATEWAY)
    assert fields["resolvedProviderId"] in ["", *available]
    assert (fields["resolvedGatewayProviderId"] != "") == (
        fields["resolvedExecutionTarget"] == GATEWAY
    )
    assert fields["resolvedGatewayProviderId"] in ("", "local", "openclaw")
    assert fields["unavailable"] == ("unavailableCode" in fields)
    if fields["unavailable"]:
        assert fields["resolvedProviderId"] == ""
    assert fields["skillResolutionSource"] == (
        "local_match" if fields["resolvedSkills"] else "none"
    )


# --- decisions without skills or memory: shared, the same as built -------------------

_WORDS = st.sampled_from(["", "codex", "Gemini", "nope", "singleAgent", "gateway", "x y"])


@PROPS
@given(
    mode=st.sampled_from(["explicit", "auto", ""]),
    target=_WORDS,
    provider=_WORDS,
    model=_WORDS,
    gateway=_WORDS,
    prompt=st.sampled_from(["hello", "use the pdf skill", "read this file", ""]),
    available=st.lists(st.sampled_from(CATALOG), max_size=3),
)
def test_a_shared_decision_equals_one_built_for_the_turn(
    mode: str,
    target: str,
    provider: str,
    model: str,
    gateway: str,
    prompt: str,
    available: list[str],
) -> None:
    routing = {
        "routingMode": mode,
        "explicitExecutionTarget": target,
        "explicitProviderId": provider,
        "explicitModel": model,
        "preferredGatewayProviderId": gateway,
    }
    got = resolve(routing, available)
    again = resolve(routing, available)
    with pytest.MonkeyPatch.context() as mp:  # not the shared path: built field by field
        mp.setattr(resolver, "NO_SKILLS", SkillResult(source=NONE))
        built = resolve(routing, available)
    assert got == built and again == built
    assert got.fields() == built.fields()


def test_shared_decisions_are_shared_and_bounded() -> None:
    first = resolve(explicit("singleAgent", explicitProviderId="codex"), CATALOG)
    assert resolve(explicit("singleAgent", explicitProviderId="codex"), CATALOG) is first
    for i in range(resolver.PLAIN_CACHED + 10):  # the model is client text
        resolve(explicit("singleAgent", explicitModel=f"m{i}"), CATALOG)
    assert len(resolver._PLAIN) <= resolver.PLAIN_CACHED


@pytest.mark.parametrize(
    "routing",
    [
        lambda i, long: explicit("singleAgent", explicitModel=f"{long}{i}"),
        lambda i, long: explicit("singleAgent", explicitProviderId=f"{long}{i}"),  # message
    ],
    ids=["model", "message"],
)
def test_shared_decisions_hold_little_client_text(routing: Any) -> None:
    """Some of the strings a shared decision is kept by are the client's (a model, a
    message quoting a provider id): however long the ones a client sends (up to
    limits.max_body_bytes), the decisions kept hold a bounded amount of text, and
    each decision still equals the one built for its turn."""
    long = "x" * 65536
    resolver._PLAIN.clear()
    for i in range(resolver.PLAIN_CACHED + 10):
        got = resolve(routing(i, long), CATALOG)
        with pytest.MonkeyPatch.context() as mp:  # built field by field
            mp.setattr(resolver, "NO_SKILLS", SkillResult(source=NONE))
            assert got == resolve(routing(i, long), CATALOG)
    held = sum(len(s) for key in resolver._PLAIN for s in key)
    assert held <= 256 * 1024  # not PLAIN_CACHED x 64 KiB
    short = resolve(explicit("singleAgent", explicitModel="m"), CATALOG)
    assert resolve(explicit("singleAgent", explicitModel="m"), CATALOG) is short


def test_long_explicit_targets_are_not_held_by_the_cache() -> None:
    # the target names' cache kept each client value as its key: 256 unknown targets
    # the size of a request body held a GiB
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(32):
            value = f"{i:04d}" + "x" * (256 * 1024)
            assert resolver.explicit_target(value) == ""
            del value
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1024 * 1024  # 8 MiB before the fix
    assert resolver.explicit_target("-" * 1000 + "Multi_Agent") == "multi-agent"


def test_a_long_explicit_target_is_still_mapped_in_a_resolution() -> None:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "_" * 100 + "gateway"}
    assert resolve(routing, CATALOG).execution_target == GATEWAY
