"""Table-driven tests of the full auto resolver (routing.md §2–§5, with the
token-matching fix of §9.2): every keyword list, every decision-table row,
classifier and memory fallbacks, provider and skill rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from xwm_bridge.router import keywords
from xwm_bridge.router.memory import MemorySource, Preferences
from xwm_bridge.router.resolver import (
    GATEWAY,
    MULTI_AGENT,
    SINGLE_AGENT,
    RoutingDecision,
    RoutingRequest,
    resolve,
)
from xwm_bridge.router.skills import SkillCandidate

CATALOG = ["codex", "opencode", "gemini"]


def run(
    prompt: str,
    routing: dict[str, Any] | None = None,
    *,
    available: list[str] | None = None,
    memory: Preferences | None = None,
    label: str = "",
    **params: Any,
) -> tuple[RoutingDecision, list[str]]:
    asked: list[str] = []

    async def classify(p: str) -> str:
        asked.append(p)
        return label

    req = RoutingRequest.parse(
        {"taskPrompt": prompt, "routing": routing or {"routingMode": "auto"}, **params}
    )
    assert req is not None
    decision = asyncio.run(
        resolve(
            req,
            CATALOG if available is None else available,
            memory=memory,
            classify=classify,
        )
    )
    return decision, asked


# --- keyword predicates: every documented keyword -------------------------------------


@pytest.mark.parametrize("kw", keywords.LOCAL)
def test_every_local_keyword_routes_single_agent(kw: str) -> None:
    decision, asked = run(f"please handle {kw} now")
    assert keywords.looks_local(f"please handle {kw} now")
    assert decision.execution_target == SINGLE_AGENT
    assert decision.provider_id == "codex"
    assert asked == []  # keywords decide; the classifier is not consulted


@pytest.mark.parametrize("kw", keywords.ONLINE)
def test_every_online_keyword_routes_gateway(kw: str) -> None:
    decision, asked = run(f"please do {kw} now", preferredGatewayProviderId="x")
    assert keywords.looks_online(f"please do {kw} now")
    assert decision.execution_target == GATEWAY
    assert decision.gateway_provider_id == "local"
    assert decision.provider_id == ""
    assert asked == []


@pytest.mark.parametrize("kw", keywords.STRONG)
def test_every_strong_signal_is_complex(kw: str) -> None:
    assert keywords.looks_complex(f"x {kw} y")
    assert run(f"x {kw} y")[0].execution_target == MULTI_AGENT


@pytest.mark.parametrize(
    ("group_a", "group_b"),
    [
        (keywords.REVIEW, keywords.MULTI_STEP),
        (keywords.REVIEW, keywords.STRUCTURED),
        (keywords.MULTI_STEP, keywords.STRUCTURED),
        (keywords.COLLECTION, keywords.STRUCTURED),
    ],
)
def test_complex_group_pairs(group_a: tuple[str, ...], group_b: tuple[str, ...]) -> None:
    for a in group_a:
        for b in group_b:
            prompt = f"{a} {b}"
            assert keywords.looks_complex(prompt), prompt


@pytest.mark.parametrize(
    "group",
    [keywords.REVIEW, keywords.MULTI_STEP, keywords.STRUCTURED, keywords.COLLECTION],
)
def test_single_group_alone_is_not_complex(group: tuple[str, ...]) -> None:
    others = [g for g in (keywords.REVIEW, keywords.MULTI_STEP, keywords.STRUCTURED) if g != group]
    for kw in group:
        if kw in keywords.STRONG or any(keywords.any_of(kw, g) for g in others):
            continue  # e.g. "review and" is both a review word and a multi-step phrase
        assert not keywords.looks_complex(f"just {kw} it"), kw


def test_collection_with_review_is_not_complex() -> None:
    assert not keywords.looks_complex("crawl and verify")  # online-collection + review only


# --- the former misroutes (routing.md §9.2) ----------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    [
        "I want a haiku",
        "a swan in Taiwan",
        "excellent, thanks",
        "reset my password",
        "a keyword list",
        "fix my wordpress theme",
        "do some research on cats",
        "subscribe to the newsletter",
        "swords and crosswords",
    ],
)
def test_former_misroutes_reach_the_classifier(prompt: str) -> None:
    assert not keywords.looks_local(prompt)
    assert not keywords.looks_online(prompt)
    assert not keywords.looks_complex(prompt)
    decision, asked = run(prompt, label="multi-agent")
    assert asked == [prompt]
    assert decision.execution_target == MULTI_AGENT


@pytest.mark.parametrize(
    ("prompt", "local", "online"),
    [
        ("Convert this Word file", True, False),
        ("open the PDFs", True, False),
        ("export to Excel.", True, False),
        ("crop image please", True, False),
        ("crop   image please", True, False),
        ("search the web", False, True),
        ("latest NEWS", False, True),
        ("add subtitles", False, True),
        ("用文生图做海报", False, True),
        ("wan2.1 video", False, True),
    ],
)
def test_tokens_still_match(prompt: str, local: bool, online: bool) -> None:
    assert keywords.looks_local(prompt) is local
    assert keywords.looks_online(prompt) is online


# --- decision table rows, in order ---------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("review the pdf and write a report", MULTI_AGENT),  # L and C
        ("search the news and write a report", MULTI_AGENT),  # O and C
        ("convert the docx", SINGLE_AGENT),  # L
        ("browser automation please", GATEWAY),  # O
        ("review and summarize the logs in a table", MULTI_AGENT),  # C
        ("先整理然后汇总", MULTI_AGENT),  # C via CJK
    ],
)
def test_keyword_rows(prompt: str, expected: str) -> None:
    assert run(prompt, label="single-agent")[0].execution_target == expected


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("gateway", GATEWAY),
        ("gateway-chat", GATEWAY),
        ("multi-agent", MULTI_AGENT),
        ("single-agent", SINGLE_AGENT),
    ],
)
def test_classifier_rows(label: str, expected: str) -> None:
    decision, asked = run("hello there", label=label, memory=Preferences(route="gateway"))
    assert asked == ["hello there"]
    assert decision.execution_target == expected
    assert decision.reason == "classifier"


@pytest.mark.parametrize(
    ("route", "available", "expected"),
    [
        ("gateway", CATALOG, GATEWAY),
        ("GATEWAY", CATALOG, GATEWAY),
        ("multi-agent", CATALOG, MULTI_AGENT),
        ("single-agent", CATALOG, SINGLE_AGENT),
        ("single-agent", [], GATEWAY),  # single-agent memory needs a provider
        ("nonsense", CATALOG, SINGLE_AGENT),  # ≥1 provider
        ("", [], GATEWAY),  # otherwise
    ],
)
def test_memory_and_fallback_rows(route: str, available: list[str], expected: str) -> None:
    decision, _ = run("hello", available=available, memory=Preferences(route=route))
    assert decision.execution_target == expected


def test_explicit_mode_skips_keywords_and_classifier() -> None:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}
    decision, asked = run("search the news", routing, label="gateway")
    assert decision.execution_target == MULTI_AGENT
    assert asked == []


# --- provider, model, skills with memory ------------------------------------------------------


def test_memory_provider_model_and_skills() -> None:
    mem = Preferences(
        model="gpt-5.4",
        skills=("PPTX", "pdf"),
        provider="Gemini",
        sources=(MemorySource("/m/memory.md", "global"),),
    )
    decision, _ = run("hello", memory=mem)
    assert decision.provider_id == "gemini"
    assert decision.model == "gpt-5.4"
    assert decision.skills == ("PPTX", "pdf")
    assert decision.skill_source == "local_match"
    assert decision.fields()["memorySources"] == [{"path": "/m/memory.md", "scope": "global"}]


def test_explicit_values_beat_memory() -> None:
    mem = Preferences(model="m1", skills=("pdf",), provider="gemini")
    routing = {
        "routingMode": "auto",
        "explicitModel": "m2",
        "explicitSkills": ["docx"],
        "explicitProviderId": "opencode",
    }
    decision, _ = run("hello", routing, memory=mem)
    assert (decision.model, decision.skills, decision.provider_id) == ("m2", ("docx",), "opencode")


def test_memory_provider_unavailable_is_ignored() -> None:
    decision, _ = run("hello", memory=Preferences(provider="claude"))
    assert decision.provider_id == "codex"
    assert not decision.unavailable
    gw, _ = run("search it", memory=Preferences(provider="claude"))
    assert gw.provider_id == "" and not gw.unavailable


def test_memory_provider_for_gateway_target() -> None:
    decision, _ = run("search it", memory=Preferences(provider="opencode"))
    assert decision.execution_target == GATEWAY
    assert decision.provider_id == "opencode"


def test_local_skill_match_example_11_1() -> None:
    skills = [
        {"id": "pptx", "label": "PPTX", "description": "slides", "installed": True},
        {"id": "docx", "label": "DOCX", "description": "docs", "installed": True},
    ]
    routing = {
        "routingMode": "auto",
        "preferredGatewayProviderId": "local",
        "availableSkills": skills,
    }
    decision, _ = run("create a powerpoint deck for this launch", routing)
    assert {"ok": True, **decision.fields()} == {
        "ok": True,
        "resolvedExecutionTarget": "single-agent",
        "resolvedProviderId": "codex",
        "resolvedGatewayProviderId": "",
        "resolvedModel": "",
        "resolvedSkills": ["PPTX"],
        "skillResolutionSource": "local_match",
        "needsSkillInstall": False,
        "unavailable": False,
    }


def test_install_needed_example_11_2() -> None:
    routing = {
        "routingMode": "auto",
        "allowSkillInstall": True,
        "availableSkills": [{"id": "docx", "label": "docx", "description": "docs"}],
    }
    decision, _ = run("translate and dub this video with subtitles", routing)
    assert decision.fields() == {
        "resolvedExecutionTarget": "gateway",
        "resolvedProviderId": "",
        "resolvedGatewayProviderId": "local",
        "resolvedModel": "",
        "resolvedSkills": None,
        "skillResolutionSource": "find_skills",
        "needsSkillInstall": True,
        "unavailable": False,
        "skillInstallRequestId": "skill-install:video-translator",
        "skillCandidates": [
            {
                "id": "video-translator",
                "label": "video-translator",
                "description": "",
                "installed": False,
            }
        ],
    }


def test_available_skills_wrong_types_are_coerced() -> None:
    routing = {
        "routingMode": "auto",
        "availableSkills": [1, "x", None, {"id": 5, "label": ["a"], "installed": "yes"}],
        "explicitSkills": "pdf",
        "allowSkillInstall": {"a": 1},
        "installApproval": [1, 2],
    }
    req = RoutingRequest.parse({"taskPrompt": 3, "routing": routing})
    assert req is not None
    assert req.prompt == "3"
    assert req.available_skills[3] == SkillCandidate("5", '["a"]', "", True)
    assert req.explicit_skills == ()
    assert req.allow_install is False
    assert req.approval.request_id == ""
