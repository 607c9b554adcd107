"""The shared permission broker: first answer wins, every resolution is published."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.providers.stdio.permissions import (
    AGENT_EXITED,
    PermissionAnswer,
    PermissionBroker,
)
from xwm_bridge.store.records import Answerer

OPTIONS = [
    {"optionId": "once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


async def test_first_valid_answer_wins_and_everyone_hears() -> None:
    broker = PermissionBroker(owner="me")
    seen: list[tuple[str, Any]] = []
    broker.listeners.append(lambda t, r: seen.append((t, r)))
    entry = broker.open("s1", OPTIONS, turn_id="turn-1", tool_call={"kind": "edit"}, timeout=5)
    assert seen[0][0] == "requested" and seen[0][1].state == "pending"
    assert seen[0][1].deadline > seen[0][1].created_at
    with pytest.raises(RpcError, match="not one of the offered"):
        broker.answer(PermissionAnswer("s1", entry.request_id, "always"))
    by = Answerer("console", "127.0.0.1:5000")
    result = broker.answer(PermissionAnswer("s1", entry.request_id, "once"), by)
    assert result["outcome"] == "allow_once"
    assert entry.future.result()["outcome"] == {"outcome": "selected", "optionId": "once"}
    kind, record = seen[-1]
    assert kind == "resolved" and record.by == by and record.outcome == "allow_once"
    with pytest.raises(
        RpcError, match=r"already resolved \(allow_once\) by console 127.0.0.1:5000"
    ):
        broker.answer(PermissionAnswer("s1", entry.request_id, "reject"))
    with pytest.raises(RpcError, match="no pending permission request"):
        broker.answer(PermissionAnswer("s1", "perm-nope", "once"))
    broker.discard(entry)  # already resolved: nothing more is published
    assert len(seen) == 2
    assert broker.snapshot() == [] and broker.snapshot(include_resolved=True)[0].state == "resolved"


async def test_close_session_resolves_as_cancelled_to_the_agent() -> None:
    broker = PermissionBroker()
    a = broker.open("s1", OPTIONS)
    b = broker.open("s2", OPTIONS)
    assert broker.close_session("s1", AGENT_EXITED, "agent exited (exit status 4)") == 1
    assert a.future.result() == {"outcome": {"outcome": "cancelled"}}
    assert a.record.resolution == AGENT_EXITED and a.record.outcome == "cancelled"
    assert not b.future.done()
    assert broker.cancel_session("s2") == 1 and b.record.resolution == "cancelled"
    assert [r.session_id for r in broker.snapshot()] == []


async def test_a_discarded_open_request_is_resolved_turn_ended() -> None:
    broker = PermissionBroker()
    seen: list[str] = []
    broker.listeners.append(lambda t, r: seen.append(r.resolution))
    entry = broker.open("s1", OPTIONS)
    broker.discard(entry)
    assert seen == ["", "turn_ended"] and broker.pending == {}


async def test_an_answer_is_checked_against_the_requests_own_principal() -> None:
    """``may_answer`` sees the principal of the turn that raised the request, pending or
    resolved (a refused caller is not told who answered)."""
    broker = PermissionBroker()
    entry = broker.open("s1", OPTIONS, principal="alice")
    asked: list[str] = []

    def only_alice(principal: str) -> bool:  # as SessionRegistry.may_use for alice
        asked.append(principal)
        return not principal or principal == "alice"

    answer = PermissionAnswer("s1", entry.request_id, "once")
    with pytest.raises(RpcError, match="session belongs to another client") as info:
        broker.answer(answer, Answerer("ws", "127.0.0.1:1", "mallory"), lambda p: False)
    assert info.value.code == -32003 and not entry.future.done()
    by = Answerer("ws", "127.0.0.1:2", "alice")
    assert broker.answer(answer, by, only_alice)["outcome"] == "allow_once"
    with pytest.raises(RpcError, match="session belongs to another client"):
        broker.answer(answer, None, lambda p: False)  # resolved: "by ws 127.0.0.1:2" not said
    assert asked == ["alice"]
    unowned = broker.open("s2", OPTIONS)  # no principal recorded: anyone's, as a session
    assert broker.answer(PermissionAnswer("s2", unowned.request_id, "once"), None, only_alice)
    assert asked == ["alice", ""]


async def test_decline_answers_one_open_request_cancelled() -> None:
    broker = PermissionBroker()
    entry = broker.open("s1", OPTIONS)
    other = broker.open("s1", OPTIONS)
    assert broker.decline("s1", entry.request_id, "chose nothing") is True
    assert entry.future.result() == {"outcome": {"outcome": "cancelled"}}
    assert not other.future.done()  # only the one named
    assert broker.decline("s1", entry.request_id, "again") is False  # already resolved
    assert broker.decline("s1", "perm-none", "unknown") is False
    (record,) = broker.resolved
    assert (record.resolution, record.outcome, record.reason) == (
        "cancelled",
        "cancelled",
        "chose nothing",
    )


FIRST_REQUEST_ID = """
import asyncio
from xwm_bridge.providers.stdio.permissions import PermissionBroker

async def main() -> None:
    print(PermissionBroker().open("s1", []).request_id)

asyncio.run(main())
"""


def test_another_process_never_hands_out_the_same_request_ids() -> None:
    """A request id names one request, whichever process raised it: a restarted bridge
    counted from perm-1 again, and so does every replica, so an answer meant for a
    request seen before a restart (``client approve perm-3 …``, a console card) selected
    the option of another tool call, and ``client approve`` took the first of two
    replicas' pending ``perm-3`` — another session's. Each process's ids are its own."""
    ids = [
        subprocess.run(
            [sys.executable, "-c", FIRST_REQUEST_ID], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert all(i.startswith("perm-") for i in ids) and ids[0] != ids[1], ids
