"""Every input field of xworkmate.routing.resolve with a wrong type gets the
documented coercion (routing.md §1): text, string list, loose bool, object."""

from __future__ import annotations

from typing import Any

import pytest

from xwm_bridge.router.resolver import RoutingRequest
from xwm_bridge.router.skills import SkillCandidate


def parse(routing: dict[str, Any], **top: Any) -> RoutingRequest:
    req = RoutingRequest.parse({"routing": {"routingMode": "auto", **routing}, **top})
    assert req is not None
    return req


@pytest.mark.parametrize("routing", [None, "auto", 1, [], {}, [{"routingMode": "auto"}]])
def test_routing_not_a_non_empty_object(routing: Any) -> None:
    assert RoutingRequest.parse({"routing": routing}) is None


@pytest.mark.parametrize(
    ("field", "value", "attr", "expected"),
    [
        ("taskPrompt", {"a": 1}, "prompt", '{"a":1}'),
        ("taskPrompt", 12.0, "prompt", "12"),
        ("workingDirectory", ["x"], "working_directory", '["x"]'),
        ("workingDirectory", None, "working_directory", ""),
        ("aiGatewayBaseUrl", 5, "gateway_base_url", "5"),
        ("aiGatewayApiKey", True, "gateway_api_key", "true"),
    ],
)
def test_top_level_text_fields(field: str, value: Any, attr: str, expected: str) -> None:
    assert getattr(parse({}, **{field: value}), attr) == expected


@pytest.mark.parametrize(
    ("field", "value", "attr", "expected"),
    [
        ("routingMode", 1, "routing_mode", "1"),
        ("routingMode", ["explicit"], "routing_mode", '["explicit"]'),
        ("preferredGatewayProviderId", 7, "gateway_provider", "local"),
        ("preferredGatewayProviderId", " OpenClaw ", "gateway_provider", "openclaw"),
        ("explicitExecutionTarget", {"t": 1}, "explicit_target", '{"t":1}'),
        ("explicitProviderId", False, "explicit_provider", "false"),
        ("explicitModel", 4, "explicit_model", "4"),
        ("explicitSkills", "pdf", "explicit_skills", ()),
        ("explicitSkills", [1, None, " a ", ""], "explicit_skills", ("1", "a")),
        ("allowSkillInstall", "yes", "allow_install", True),
        ("allowSkillInstall", "maybe", "allow_install", False),
        ("allowSkillInstall", 2, "allow_install", True),
        ("allowSkillInstall", [1], "allow_install", False),
    ],
)
def test_routing_fields(field: str, value: Any, attr: str, expected: Any) -> None:
    assert getattr(parse({field: value}), attr) == expected


@pytest.mark.parametrize(
    ("approval", "request_id", "keys"),
    [
        ("x", "", ()),
        ([1], "", ()),
        ({"requestId": 5, "approvedSkillKeys": "a"}, "5", ()),
        ({"requestId": None, "approvedSkillKeys": [1, "", "b"]}, "", ("1", "b")),
    ],
)
def test_install_approval(approval: Any, request_id: str, keys: tuple[str, ...]) -> None:
    req = parse({"installApproval": approval})
    assert (req.approval.request_id, req.approval.approved_keys) == (request_id, keys)


@pytest.mark.parametrize(
    ("skills", "expected"),
    [
        ("pptx", ()),
        ({"id": "x"}, ()),
        ([1, "x"], (SkillCandidate(), SkillCandidate())),
        (
            [{"id": 1, "label": None, "description": ["d"], "installed": "on"}],
            (SkillCandidate("1", "", '["d"]', True),),
        ),
        ([{"installed": 1.5}], (SkillCandidate(installed=True),)),
    ],
)
def test_available_skills(skills: Any, expected: tuple[SkillCandidate, ...]) -> None:
    assert parse({"availableSkills": skills}).available_skills == expected


def test_too_many_available_skills_is_a_clear_invalid_params() -> None:
    # each candidate's keywords are searched in the whole prompt: 20,000 of them with a
    # 2 MB prompt held the event loop (every session) for many minutes
    from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
    from xwm_bridge.router.resolver import MAX_AVAILABLE_SKILLS

    skills = [{"id": f"s{i}"} for i in range(MAX_AVAILABLE_SKILLS)]
    assert len(parse({"availableSkills": skills}).available_skills) == MAX_AVAILABLE_SKILLS
    with pytest.raises(RpcError) as err:
        parse({"availableSkills": [*skills, {"id": "one-more"}]})
    assert err.value.code == INVALID_PARAMS
    assert f"at most {MAX_AVAILABLE_SKILLS}" in err.value.message
