"""Which agent process serves a turn (providers/stdio/executor.py ``agent``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tests.markers import both_loops
from xwm_bridge.config import AgentsConfig, BridgeConfig, ProviderConfig
from xwm_bridge.providers.stdio.executor import AgentBusy, StdioAgentExecutor, currency_label
from xwm_bridge.providers.stdio.permissions import PermissionBroker


def executor(sandbox: str) -> StdioAgentExecutor:
    provider = ProviderConfig("gem", kind="stdio", command=(sys.executable, "-V"))
    # bwrap_path: any executable (the argv is only built here, never run)
    agents = AgentsConfig(sandbox=sandbox, bwrap_path=sys.executable)
    return StdioAgentExecutor(
        BridgeConfig(providers=(provider,), agents=agents), PermissionBroker()
    )


@both_loops
async def test_a_protocol_version_set_for_a_provider_reaches_each_of_its_processes(
    tmp_path: Path,
) -> None:
    """agent-adapter's GEMINI_ADAPTER_PROTOCOL_VERSION: under bwrap a process runs per
    working directory, and those the turns started kept the default version."""
    for sandbox in ("", "bwrap"):
        ex = executor(sandbox)
        async with ex.using("gem") as first:
            ex.set_protocol_version("gem", 2)
            assert first.spec.protocol_version == 2  # one that exists already
        async with ex.using("gem", str(tmp_path / "project")) as later:  # one started later
            assert later.spec.protocol_version == 2, sandbox
            assert (later is first) is (sandbox == "")


def capped(limit: int, wait: float = 10.0) -> StdioAgentExecutor:
    """A sandboxed executor with room for ``limit`` processes (none is ever started)."""
    provider = ProviderConfig("gem", kind="stdio", command=(sys.executable, "-V"))
    agents = AgentsConfig(
        sandbox="bwrap",
        bwrap_path=sys.executable,
        max_sandboxed_processes=limit,
        process_wait=wait,
    )
    return StdioAgentExecutor(
        BridgeConfig(providers=(provider,), agents=agents), PermissionBroker()
    )


@both_loops
async def test_the_cap_closes_the_least_recently_used_idle_process_never_a_held_one(
    tmp_path: Path,
) -> None:
    ex = capped(2)
    held = await ex.acquire("gem", str(tmp_path / "a"))  # the oldest, but in use
    async with ex.using("gem", str(tmp_path / "b")):
        pass
    async with ex.using("gem", str(tmp_path / "c")):
        assert [cwd for _, cwd in ex.processes._agents] == [
            str(tmp_path / "a"),
            str(tmp_path / "c"),
        ]
    assert held.users == 1
    ex.release(held)
    async with ex.using("gem", str(tmp_path / "d")):  # now "a" is the idle one to go
        assert [cwd for _, cwd in ex.processes._agents] == [
            str(tmp_path / "c"),
            str(tmp_path / "d"),
        ]


@both_loops
async def test_with_every_process_held_a_new_one_waits_for_a_release(tmp_path: Path) -> None:
    ex = capped(1)
    held = await ex.acquire("gem", str(tmp_path / "a"))
    again = await ex.acquire("gem", str(tmp_path / "a"))  # its own directory: no wait
    assert again is held and held.users == 2
    waiter = asyncio.create_task(ex.acquire("gem", str(tmp_path / "b")))
    await wait_until(lambda: ex.status()[0]["waiting"] == 1)
    assert ex.status()[0]["busy"] == 1
    ex.release(again)  # still held once: nothing may go
    await asyncio.sleep(0)  # a turn of the loop for the waiter (it must stay waiting)
    assert not waiter.done() and len(ex.processes._agents) == 1 and held.users == 1
    ex.release(held)
    got = await asyncio.wait_for(waiter, 5)
    assert list(ex.processes._agents.values()) == [got] and got is not held
    assert ex.status()[0]["waiting"] == 0
    ex.release(got)


@both_loops
async def test_with_every_process_held_past_the_wait_the_call_fails_naming_the_cap(
    tmp_path: Path,
) -> None:
    for wait, words in ((0, "are busy"), (0.05, "stayed busy for 0.05s")):
        ex = capped(1, wait)
        held = await ex.acquire("gem", str(tmp_path / "a"))
        with pytest.raises(AgentBusy) as caught:
            await ex.acquire("gem", str(tmp_path / "b"))
        assert str(caught.value) == (
            f"all 1 sandboxed agent processes {words} (agents.max_sandboxed_processes: 1)"
            "; try again when one is idle"
        )
        assert list(ex.processes._agents.values()) == [held] and ex.status()[0]["waiting"] == 0


@both_loops
async def test_many_directories_at_once_never_pass_the_cap(tmp_path: Path) -> None:
    ex = capped(3)
    most = 0

    async def turn(i: int) -> None:
        nonlocal most
        async with ex.using("gem", str(tmp_path / f"d{i % 7}")):
            most = max(most, len(ex.processes._agents))
            await asyncio.sleep(0)  # let the others run while this one is held

    await asyncio.wait_for(asyncio.gather(*(turn(i) for i in range(40))), 10)
    assert most <= 3 and len(ex.processes._agents) <= 3
    assert all(a.users == 0 for a in ex.processes._agents.values())


@both_loops
async def test_the_unsandboxed_executor_has_one_process_per_provider_and_no_cap() -> None:
    ex = executor("")
    async with ex.using("gem", "/a") as a, ex.using("gem", "/b") as b:
        assert a is b and a.users == 2
    assert a.users == 0


@pytest.mark.parametrize(
    ("currency", "label"),
    [("USD", "USD"), ("EUR", "EUR"), ("USD\n", "other"), ("usd", "other"), ("USDT", "other"),
     ("", "other"), ("US", "other")],
)  # fmt: skip
def test_the_cost_metric_currency_label_is_a_whole_three_letter_code(
    currency: str, label: str
) -> None:
    """The agent's currency is a label value only if it is wholly ``[A-Z]{3}``: the
    anchored ``match`` took ``"USD\\n"`` (a distinct label) as a code."""
    assert currency_label(currency) == label
