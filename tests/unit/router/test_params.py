"""Every input field of xworkmate.routing.resolve with a wrong type gets the
documented coercion (routing.md §1): text, string list, loose bool, object."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge import coerce
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


_VALUES = st.one_of(
    st.none(),
    st.text(alphabet=" \tab", max_size=4),
    st.integers(-3, 3),
    st.floats(allow_nan=False, allow_infinity=False, width=16),
    st.booleans(),
    st.lists(st.text(alphabet=" a", max_size=2), max_size=2),
    st.dictionaries(st.just("k"), st.integers(0, 1), max_size=1),
)
_TOP = ("taskPrompt", "workingDirectory", "aiGatewayBaseUrl", "aiGatewayApiKey")
_ROUTING = (
    "routingMode",
    "explicitExecutionTarget",
    "preferredGatewayProviderId",
    "explicitProviderId",
    "explicitModel",
    "allowSkillInstall",
)


def _coerced_one_by_one(params: dict[str, Any]) -> RoutingRequest:
    """What parse gives, each field through its coercion (no shortcut for absent keys)."""
    get = params["routing"].get
    return RoutingRequest(
        prompt=coerce.text(params.get("taskPrompt")),
        working_directory=coerce.path_text(params.get("workingDirectory"), "workingDirectory"),
        gateway_base_url=coerce.text(params.get("aiGatewayBaseUrl")),
        gateway_api_key=coerce.text(params.get("aiGatewayApiKey")),
        routing_mode=coerce.text(get("routingMode")),
        explicit_target=coerce.text(get("explicitExecutionTarget")),
        preferred_gateway=coerce.text(get("preferredGatewayProviderId")),
        explicit_provider=coerce.text(get("explicitProviderId")),
        explicit_model=coerce.text(get("explicitModel")),
        allow_install=coerce.loose_bool(get("allowSkillInstall")),
    )


@given(
    top=st.dictionaries(st.sampled_from(_TOP), _VALUES),
    routing=st.dictionaries(st.sampled_from(_ROUTING), _VALUES, min_size=1),
)
def test_parse_equals_each_field_coerced(top: dict[str, Any], routing: dict[str, Any]) -> None:
    """Absent keys skip their coercion, and a turn passes its own coerced prompt and
    working directory (SessionParams): the request is the same either way."""
    params = {**top, "routing": routing}
    expected = _coerced_one_by_one(params)
    assert RoutingRequest.parse(params) == expected
    given_fields = RoutingRequest.parse(
        params,
        prompt=coerce.text(params.get("taskPrompt")),
        working_directory=coerce.path_text(params.get("workingDirectory"), "workingDirectory"),
    )
    assert given_fields == expected
