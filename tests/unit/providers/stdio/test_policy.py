"""Permission policy (first match wins, reload on change) and the broker."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from xwm_bridge.config import PermissionRule
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.providers.stdio import policy
from xwm_bridge.providers.stdio.permissions import (
    PermissionAnswer,
    PermissionBroker,
    outcome_label,
)

FRAMES = json.loads((Path(__file__).parent / "opencode_write_frames.json").read_text())
TOOL = next(f for f in FRAMES if f.get("request") == "session/request_permission")["params"][
    "toolCall"
]


async def test_the_rule_file_is_checked_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule file was ``stat``-ed (and read) on the event loop at every permission
    request: on a hung NFS mount that froze every session. Now the check runs in a
    worker thread, one at a time, and past ``RELOAD_WAIT`` the known rules decide."""
    monkeypatch.setattr(policy, "RELOAD_WAIT", 0.2)
    path = tmp_path / "rules.yaml"
    path.write_text("- {action: reject, kind: edit}\n")
    store = policy.PolicyStore((), str(path))
    hung, entered, checks = threading.Event(), threading.Event(), []
    real_stat = os.stat

    def stat(p: Any, *args: Any, **kw: Any) -> os.stat_result:
        if str(p) == str(path):
            checks.append(threading.current_thread())
            entered.set()
            hung.wait(10)
        return real_stat(p, *args, **kw)

    monkeypatch.setattr(policy.os, "stat", stat)
    loop = asyncio.get_running_loop()
    started = loop.time()
    # the loop runs on while the check hangs: these two decide with the rules known
    first, second = await asyncio.gather(
        store.decide(TOOL, "/srv/proj"), store.decide(TOOL, "/srv/proj")
    )
    assert loop.time() - started < 2
    assert first.action == second.action == "reject"
    assert entered.is_set() and len(checks) == 1  # one check in flight, not one per call
    assert checks[0] is not threading.main_thread()
    path.write_text("- {action: allow, kind: edit}\n")
    os.utime(path, (5, 5))
    hung.set()
    await wait_until(lambda: store._reload is not None and store._reload.done())
    assert (await store.decide(TOOL, "/srv/proj")).action == "allow"


def test_first_match_wins_on_kind_and_path() -> None:
    rules = (
        PermissionRule("reject", "edit", "*.env"),
        PermissionRule("allow", "edit", "/srv/proj/*"),
        PermissionRule("reject", "*", "*"),
    )
    assert policy.decide(rules, TOOL, "/srv/proj").action == "allow"
    env_file = {**TOOL, "locations": [{"path": "/srv/proj/.env"}]}
    assert policy.decide(rules, env_file, "/srv/proj").action == "reject"
    assert "rule 1" in policy.decide(rules, env_file, "/srv/proj").reason
    # relative globs match paths relative to the session directory
    rel = (PermissionRule("allow", "edit", "x.txt"),)
    assert policy.decide(rel, TOOL, "/srv/proj").action == "allow"
    other = {**TOOL, "kind": "execute", "locations": []}
    assert policy.decide(rules[:2], other, "/srv/proj") == policy.Decision("ask", "default")
    assert policy.decide((), TOOL, "/").action == "ask"


def test_an_allow_rule_needs_every_location_of_the_call_to_match() -> None:
    """A call naming a path inside the allowed glob and one outside it was allowed (any
    location matched): ``allow edit /srv/proj/*`` let an edit of ``/etc/passwd`` too.
    Reject and ask rules still match on any location."""
    allow = (PermissionRule("allow", "edit", "/srv/proj/*"),)
    mixed = {**TOOL, "locations": [{"path": "/srv/proj/x.txt"}, {"path": "/etc/passwd"}]}
    assert policy.decide(allow, mixed, "/srv/proj") == policy.Decision("ask", "default")
    also_raw = {**TOOL, "locations": [{"path": "/srv/proj/x.txt"}], "rawInput": {"path": "/x"}}
    assert policy.decide(allow, also_raw, "/srv/proj").action == "ask"
    inside = {**TOOL, "locations": [{"path": "/srv/proj/a"}, {"path": "b"}], "rawInput": {}}
    assert policy.decide(allow, inside, "/srv/proj").action == "allow"  # b: /srv/proj/b
    relative = (PermissionRule("allow", "edit", "*.txt"),)
    two = {**TOOL, "locations": [{"path": "a.txt"}, {"path": "/srv/proj/b.txt"}], "rawInput": {}}
    assert policy.decide(relative, two, "/srv/proj").action == "allow"  # relative forms
    reject = (PermissionRule("reject", "edit", "/etc/*"), *allow)
    assert policy.decide(reject, mixed, "/srv/proj").action == "reject"
    ask = (PermissionRule("ask", "edit", "/etc/*"), PermissionRule("allow", "*", "*"))
    assert policy.decide(ask, mixed, "/srv/proj").reason.startswith("ask by rule 1")


async def test_rule_file_reloads_and_keeps_old_rules_on_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("- {action: reject, kind: edit}\n")
    store = policy.PolicyStore((), str(path))
    assert (await store.decide(TOOL, "/srv/proj")).action == "reject"
    path.write_text("rules:\n  - {action: allow, kind: '*'}\n")
    os.utime(path, (1, 1))
    assert (await store.decide(TOOL, "/srv/proj")).action == "allow"
    path.write_text("- {action: maybe}\n")
    os.utime(path, (2, 2))
    assert (
        await store.decide(TOOL, "/srv/proj")
    ).action == "allow"  # bad file: previous rules kept
    path.unlink()
    assert (await store.decide(TOOL, "/srv/proj")).action == "ask"
    with pytest.raises(ValueError):
        policy.parse_rules([{"action": "allow_always"}], "x")


async def test_a_rule_file_not_there_at_start_is_warned_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in agents.permission_rules_file was silent: every tool call asked."""
    path = tmp_path / "rules.yaml"
    with caplog.at_level("WARNING", logger="xwm_bridge.agents.policy"):
        store = policy.PolicyStore((), str(path))
        assert (await store.decide(TOOL, "/srv/proj")).action == "ask"
    warned = [r for r in caplog.records if r.getMessage() == "permission rule file not found"]
    assert [getattr(r, "path", None) for r in warned] == [str(path)]
    caplog.clear()
    path.write_text("- {action: reject, kind: edit}\n")  # appears later: it applies
    with caplog.at_level("WARNING", logger="xwm_bridge.agents.policy"):
        assert (await store.decide(TOOL, "/srv/proj")).action == "reject"
        policy.PolicyStore((), str(path))
    assert not caplog.records


async def test_broker_answer_validation_and_cancel() -> None:
    broker = PermissionBroker()
    options = [
        {"optionId": "once", "kind": "allow_once"},
        {"optionId": "no", "kind": "reject_once"},
    ]
    entry = broker.open("s1", options)
    with pytest.raises(RpcError):
        broker.answer(PermissionAnswer("s1", entry.request_id, "always"))
    with pytest.raises(RpcError):
        broker.answer(PermissionAnswer("other", entry.request_id, "once"))
    assert broker.answer(PermissionAnswer("s1", entry.request_id, "once"))["accepted"] is True
    outcome = await asyncio.wait_for(entry.future, 1)
    assert outcome_label(outcome, options) == "allow_once"
    second = broker.open("s1", options)
    assert broker.cancel_session("s1") == 1
    assert outcome_label(await second.future, options) == "cancelled"
    with pytest.raises(RpcError) as info:
        PermissionAnswer.parse({"sessionId": "s1", "requestId": 3, "optionId": "x"})
    assert info.value.code == -32602


def test_streamless_rules_apply_only_without_a_stream() -> None:
    from xwm_bridge.providers.stdio.policy import decide, parse_rules

    rules = parse_rules([{"action": "reject", "streamless": True}], "rules")
    assert rules[0].streamless is True
    tool = {"kind": "edit", "locations": [{"path": "/srv/a"}]}
    assert decide(rules, tool, "/srv").action == "ask"
    streamless = decide(rules, tool, "/srv", streamless=True)
    assert streamless.action == "reject" and "streamless" in streamless.reason
    with pytest.raises(ValueError, match="streamless"):
        parse_rules([{"action": "reject", "streamless": "yes"}], "rules")


@pytest.mark.parametrize(
    "raw",
    [
        {"source": "/srv/proj/a.txt", "destination": "/etc/cron.d/a"},  # a move's target
        {"path": "/srv/proj/a.txt", "new_path": "/etc/cron.d/a"},
        {"oldPath": "/srv/proj/a.txt", "newPath": "/etc/cron.d/a"},
        {"filePath": "/srv/proj/a.txt", "target": "/etc/cron.d/a"},
        {"paths": ["/srv/proj/a.txt", "/etc/cron.d/a"]},  # gemini's read_many_files
        {"dest_path": "/etc/cron.d/a"},
    ],
)
def test_an_allow_rule_sees_every_path_field_of_the_raw_input(raw: dict[str, object]) -> None:
    """Only ``path``/``filePath``/``file_path``/``filepath``/``absolute_path`` were read
    from ``rawInput``: ``allow move /srv/proj/*`` let a move whose location is inside
    the project and whose ``destination`` (``new_path``, ``target``, a ``paths`` list)
    is ``/etc/cron.d`` run without asking; a ``reject /etc/*`` rule did not see it."""
    move = {"kind": "move", "locations": [{"path": "/srv/proj/a.txt"}], "rawInput": raw}
    allow = (PermissionRule("allow", "move", "/srv/proj/*"),)
    assert policy.decide(allow, move, "/srv/proj") == policy.Decision("ask", "default")
    reject = (PermissionRule("reject", "*", "/etc/*"), *allow)
    assert policy.decide(reject, move, "/srv/proj").action == "reject"
    inside = {**move, "rawInput": {k: _inside(v) for k, v in raw.items()}}
    assert policy.decide(allow, inside, "/srv/proj").action == "allow"


def _inside(value: object) -> object:
    if isinstance(value, list):
        return [_inside(v) for v in value]
    return "/srv/proj/b.txt" if value == "/etc/cron.d/a" else value


def test_an_allow_rule_sees_the_path_of_a_diff_in_the_content() -> None:
    """An edit announcing ``locations: [/srv/proj/x]`` with a ``diff`` content item for
    ``/etc/passwd`` was allowed by ``allow edit /srv/proj/*``: the diff's ``path`` was
    not a path of the call."""
    edit = {
        "kind": "edit",
        "locations": [{"path": "/srv/proj/x"}],
        "content": [{"type": "diff", "path": "/etc/passwd", "oldText": "", "newText": "x"}],
    }
    allow = (PermissionRule("allow", "edit", "/srv/proj/*"),)
    assert policy.decide(allow, edit, "/srv/proj").action == "ask"
    edit["content"] = [{"type": "diff", "path": "/srv/proj/x", "oldText": "", "newText": "x"}]
    assert policy.decide(allow, edit, "/srv/proj").action == "allow"
    # a diff alone is a path of the call: a call without locations is judged by it
    assert policy.decide(allow, {**edit, "locations": []}, "/srv/proj").action == "allow"


def test_text_fields_that_are_not_paths_are_not_read_as_paths() -> None:
    edit = {
        "kind": "edit",
        "locations": [{"path": "/srv/proj/x"}],
        "rawInput": {"path": "/srv/proj/x", "old_string": "/etc/a", "content": "/etc/b"},
    }
    allow = (PermissionRule("allow", "edit", "/srv/proj/*"),)
    assert policy.decide(allow, edit, "/srv/proj").action == "allow"
