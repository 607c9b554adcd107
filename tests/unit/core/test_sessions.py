"""xwm_bridge.core.sessions: records, running-turn handles, idle reaping (contract.md §12)."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xwm_bridge.core.handles import TurnHandle
from xwm_bridge.core.sessions import MAX_HISTORY, Session, SessionRegistry
from xwm_bridge.store.base import SessionRecord

# --- Session --------------------------------------------------------------------------


def test_new_session_defaults() -> None:
    s = Session("s1", "t1")
    assert (s.session_id, s.thread_id, s.provider, s.history, s.seq) == ("s1", "t1", "", [], 0)
    assert s.last_used <= time.monotonic()


def test_seq_starts_at_one() -> None:
    s = Session("s", "t")
    assert [s.next_seq() for _ in range(3)] == [1, 2, 3]
    assert s.seq == 3


def test_history_ignores_blank_and_is_capped() -> None:
    s = Session("s", "t")
    s.add_prompt("")
    assert s.history == []
    for i in range(MAX_HISTORY + 10):
        s.add_prompt(f"p{i}")
    assert len(s.history) == MAX_HISTORY
    assert s.history[0] == "p10"
    assert s.history[-1] == f"p{MAX_HISTORY + 9}"


def test_history_under_cap_keeps_everything() -> None:
    s = Session("s", "t")
    for p in ("a", "b", "c"):
        s.add_prompt(p)
    assert s.history == ["a", "b", "c"]


def _add_prompt_recounting(history: list[str], prompt: str, cap: int) -> None:
    """``Session.add_prompt`` as it was before its running total: summed every time."""
    if not prompt:
        return
    history.append(prompt)
    del history[:-MAX_HISTORY]
    if sum(map(len, history)) * 4 <= cap:
        return
    sizes = [len(p.encode()) for p in history]
    total, drop = sum(sizes), 0
    while total > cap and drop < len(sizes) - 1:
        total -= sizes[drop]
        drop += 1
    del history[:drop]


_PROMPTS = st.text(alphabet="ab\u00e9\u4e2d\U0001f600", max_size=40)
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _PROMPTS),
        st.tuples(st.just("replace"), st.lists(_PROMPTS, max_size=70)),  # restore, reset
        st.tuples(st.just("append"), _PROMPTS),  # the list changed behind add_prompt
    ),
    max_size=150,
)


@given(steps=_STEPS, cap=st.integers(min_value=1, max_value=600))
def test_history_running_total_is_the_sum(steps: list[tuple[str, object]], cap: int) -> None:
    """The running character total gives the history the recounting version gives,
    and equals ``sum(map(len, history))`` after every prompt."""
    s = Session("s", "t", history_max_bytes=cap)
    expected: list[str] = []
    for op, arg in steps:
        if op == "add":
            assert isinstance(arg, str)
            s.add_prompt(arg)
            _add_prompt_recounting(expected, arg, cap)
            if arg:  # counted just now: the total is that of the list as it is
                assert s._counted is s.history and s._counted_len == len(s.history)
                assert s._chars == sum(map(len, s.history))
        elif op == "replace":
            assert isinstance(arg, list)
            s.history, expected = list(arg), list(arg)
        else:
            assert isinstance(arg, str)
            s.history.append(arg)
            expected.append(arg)
        assert s.history == expected


# --- registry: reset / get_or_create / close ------------------------------------------


def test_history_is_bounded_by_bytes_oldest_first() -> None:
    """issue 16 item 12: 64 prompts of 3.9 MiB used to stay in memory and in every save."""
    s = Session("s", "t", history_max_bytes=10_000)
    for i in range(64):
        s.add_prompt(f"{i:02d}" + "p" * 3_998)
    assert len(s.history) == 2 and s.history[-1].startswith("63")
    assert sum(len(p.encode()) for p in s.history) <= 10_000
    s.add_prompt("é" * 20_000)  # alone over the cap: the latest prompt always stays
    assert s.history == ["é" * 20_000]


def test_registry_applies_the_history_cap() -> None:
    reg = SessionRegistry(history_max_bytes=100)
    assert reg.get_or_create("s", "t").history_max_bytes == 100
    assert reg.reset("s2", "t").history_max_bytes == 100


def test_get_or_create_creates_once() -> None:
    reg = SessionRegistry()
    assert reg.get("s") is None
    s = reg.get_or_create("s", "t")
    assert reg.get("s") is s
    assert reg.get_or_create("s", "t") is s
    assert len(reg) == 1


def test_get_or_create_updates_thread_only_when_non_blank() -> None:
    reg = SessionRegistry()
    s = reg.get_or_create("s", "t1")
    reg.get_or_create("s", "t2")
    assert s.thread_id == "t2"
    reg.get_or_create("s", "")
    assert s.thread_id == "t2"


def test_get_or_create_touches_last_used() -> None:
    reg = SessionRegistry()
    s = reg.get_or_create("s", "t")
    s.last_used = 0.0
    reg.get_or_create("s", "t")
    assert s.last_used > 0.0


def test_reset_replaces_the_record() -> None:
    reg = SessionRegistry()
    old = reg.get_or_create("s", "t1")
    old.next_seq()
    old.add_prompt("hello")
    old.provider = "codex"
    new = reg.reset("s", "t2")
    assert new is not old
    assert reg.get("s") is new
    assert (new.thread_id, new.seq, new.history, new.provider) == ("t2", 0, [], "")
    assert new.next_seq() == 1
    # the old record is untouched (a still-running turn keeps writing to it)
    assert old.seq == 1 and old.history == ["hello"]


def test_reset_creates_when_missing() -> None:
    reg = SessionRegistry()
    s = reg.reset("s", "t")
    assert reg.get("s") is s and len(reg) == 1


def test_close() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    assert reg.close("s") is True
    assert reg.get("s") is None
    assert reg.close("s") is False
    assert len(reg) == 0


def test_recreated_after_close_is_fresh() -> None:
    reg = SessionRegistry()
    s = reg.get_or_create("s", "t")
    s.next_seq()
    reg.close("s")
    again = reg.get_or_create("s", "t")
    assert again is not s and again.seq == 0 and again.next_seq() == 1


# --- TurnHandle -----------------------------------------------------------------------


async def _cancelled() -> str:
    return "on_cancel"


def test_cancel_before_the_executor_runs() -> None:
    handle = TurnHandle("s", "turn-1")
    assert handle.cancel() is True
    assert handle.cancel_requested is True
    assert not handle.executing


async def test_execute_after_cancel_runs_only_the_cancel_path() -> None:
    handle = TurnHandle("s", "turn-1")
    handle.cancel()
    ran: list[str] = []

    async def run() -> str:
        ran.append("run")
        return "done"

    assert await handle.execute(run, _cancelled) == "on_cancel"
    assert ran == []
    assert handle.cancel() is False  # finished


async def test_cancel_interrupts_the_running_executor_in_the_same_task() -> None:
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()

    async def run() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    async def turn() -> tuple[str, int]:
        result = await handle.execute(run, _cancelled)
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    task = asyncio.create_task(turn())
    await started.wait()
    assert handle.executing
    assert handle.cancel() is True
    # the client's cancel is consumed: the task goes on, with nothing left pending
    assert await task == ("on_cancel", 0)
    assert handle.cancel() is False


async def test_a_finished_turn_is_not_cancelled() -> None:
    handle = TurnHandle("s", "turn-1")

    async def run() -> str:
        return "ok"

    assert await handle.execute(run, _cancelled) == "ok"
    assert handle.cancel() is False
    assert handle.cancel_requested is False


async def test_shutdown_cancellation_propagates() -> None:
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()

    async def run() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(handle.execute(run, _cancelled))
    await started.wait()
    task.cancel()  # not through the handle: a shutdown
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_client_cancel_plus_shutdown_propagates() -> None:
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()

    async def run() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(handle.execute(run, _cancelled))
    await started.wait()
    handle.cancel()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_executor_that_swallows_the_cancel_leaves_the_task_clean() -> None:
    handle = TurnHandle("s", "turn-1")
    started = asyncio.Event()

    async def run() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "stopped by the agent"
        return "never"

    async def turn() -> tuple[str, int]:
        result = await handle.execute(run, _cancelled)
        task = asyncio.current_task()
        assert task is not None
        return result, task.cancelling()

    task = asyncio.create_task(turn())
    await started.wait()
    handle.cancel()
    assert await task == ("stopped by the agent", 0)
    assert handle.cancel_requested


# --- registry: running turns and cancel -----------------------------------------------


def test_cancel_without_running_turn() -> None:
    reg = SessionRegistry()
    assert reg.cancel("missing") is False
    reg.get_or_create("s", "t")
    assert reg.cancel("s") is False


def test_cancel_running_turn_before_its_task_starts() -> None:
    reg = SessionRegistry()
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    assert reg.running("s") is handle
    assert reg.running_count() == 1
    assert reg.cancel("s") is True
    assert handle.cancel_requested


async def test_cancel_running_turn_task() -> None:
    reg = SessionRegistry()
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    started = asyncio.Event()

    async def run() -> str:
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(handle.execute(run, _cancelled))
    await started.wait()
    assert reg.cancel("s") is True
    assert await task == "on_cancel"


def test_turn_finished_clears_only_its_own_handle() -> None:
    reg = SessionRegistry()
    old = TurnHandle("s", "turn-old")
    new = TurnHandle("s", "turn-new")
    reg.turn_started(old)
    reg.turn_started(new)
    reg.turn_finished(old)  # a stale finish must not clear the newer turn
    assert reg.running("s") is new
    reg.turn_finished(new)
    assert reg.running("s") is None
    assert reg.running_count() == 0


def test_reset_keeps_the_running_turn_cancellable() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    reg.reset("s", "t")
    assert reg.cancel("s") is True
    assert handle.cancel_requested


def test_close_cancels_running_turn() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    assert reg.close("s") is True
    assert handle.cancel_requested


def test_close_without_record_still_cancels_but_reports_false() -> None:
    reg = SessionRegistry()
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    assert reg.close("s") is False
    assert handle.cancel_requested


async def test_close_reserves_the_id_until_the_cancelled_turn_ends() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    reg.close("s")
    closing = reg.closing("s")
    assert closing is not None and closing.handles == [handle]
    reg.close("s")  # a second close keeps the same reservation
    assert reg.closing("s") is closing
    waiter = asyncio.ensure_future(reg.until_closed("s"))
    await asyncio.sleep(0)  # let it start waiting (asserted right below)
    assert closing.waiters == 1 and not waiter.done()
    reg.turn_finished(handle)
    await asyncio.wait_for(waiter, 5)
    assert reg.closing("s") is None and closing.waiters == 0


async def test_a_turn_waiting_for_a_close_is_refused_past_the_bound() -> None:
    from xwm_bridge.jsonrpc import QUEUE_FULL, RpcError

    reg = SessionRegistry()
    reg.close_wait = 0.0
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    reg.close("s")
    with pytest.raises(RpcError) as info:
        await reg.until_closed("s")
    assert info.value.code == QUEUE_FULL
    await reg.until_closed("other")  # nothing closing: returns at once


def test_close_of_an_idle_session_reserves_nothing() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    assert reg.close("s") is True
    assert reg.closing("s") is None


# --- reaping --------------------------------------------------------------------------


def test_reap_idle_sessions() -> None:
    reg = SessionRegistry()
    old = reg.get_or_create("old", "t")
    fresh = reg.get_or_create("fresh", "t")
    old.last_used = 100.0
    fresh.last_used = 190.0
    assert reg.reap(60, now=200.0) == 1
    assert reg.get("old") is None
    assert reg.get("fresh") is fresh


def test_reap_boundary_is_inclusive() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t").last_used = 100.0
    assert reg.reap(60, now=159.9) == 0
    assert reg.reap(60, now=160.0) == 1


def test_reap_skips_running_sessions() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t").last_used = 0.0
    handle = TurnHandle("s", "turn-1")
    reg.turn_started(handle)
    assert reg.reap(1, now=1000.0) == 0
    reg.turn_finished(handle)
    assert reg.reap(1, now=1000.0) == 1


def test_reap_skips_queued_sessions() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t").last_used = 0.0
    reg.turn_queued("s")
    reg.turn_queued("s")
    assert reg.reap(1, now=1000.0) == 0
    reg.turn_dequeued("s")
    assert reg.reap(1, now=1000.0) == 0  # one still queued
    reg.turn_dequeued("s")
    # dequeuing touches the session, so its idle time starts again
    session = reg.get("s")
    assert session is not None and session.last_used > 0.0
    assert reg.reap(1, now=session.last_used + 0.5) == 0
    assert reg.reap(1, now=session.last_used + 1.0) == 1


def test_turn_dequeued_without_queued_is_harmless() -> None:
    reg = SessionRegistry()
    reg.turn_dequeued("nobody")
    reg.get_or_create("s", "t").last_used = 0.0
    assert reg.reap(1, now=1000.0) == 1


def test_reap_with_real_clock() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "t")
    assert reg.reap(3600) == 0
    assert reg.reap(0) == 1


# --- ownership (issue 16 item 8) -------------------------------------------------------


async def test_sessions_belong_to_their_principal() -> None:
    from xwm_bridge.jsonrpc import RpcError

    reg = SessionRegistry()
    reg.enforce_owner, reg.admins = True, frozenset({"admin"})
    s = reg.get_or_create("s1", "t1")
    reg.claim(s, "alice")
    assert s.owner == "alice" and s.snapshot().owner == "alice"
    reg.claim(s, "alice")
    reg.claim(s, "admin")  # an admin may use it, and does not take it over
    assert s.owner == "alice"
    with pytest.raises(RpcError) as info:
        reg.claim(s, "bob")
    assert info.value.code == -32003
    await reg.check_owner("s1", "alice")
    await reg.check_owner("s1", "admin")
    await reg.check_owner("unknown", "bob")  # nobody's yet
    with pytest.raises(RpcError):
        await reg.check_owner("s1", "bob")
    # a session only in the store is checked there
    reg.store.save(s.snapshot())
    reg.reap(0, now=time.monotonic() + 10)
    assert reg.get("s1") is None
    with pytest.raises(RpcError):
        await reg.check_owner("s1", "bob")
    restored = await reg.load("s1", "t1")
    assert restored.owner == "alice"


async def test_ownership_is_not_enforced_without_authentication() -> None:
    reg = SessionRegistry()  # enforce_owner is off: any bearer is accepted, it names nobody
    s = reg.get_or_create("s1", "t1")
    reg.claim(s, "alice")
    reg.claim(s, "bob")
    await reg.check_owner("s1", "bob")
    assert s.owner == "alice"  # recorded all the same


# --- one session, turns on two threads (contract.md §12: the queue key is threadId) --


def test_cancel_reaches_every_running_turn_of_the_session() -> None:
    reg = SessionRegistry()
    first = TurnHandle("s", "turn-a")  # thread a
    second = TurnHandle("s", "turn-b")  # thread b, started while a still runs
    reg.turn_started(first)
    reg.turn_started(second)
    assert reg.running_count() == 2
    assert reg.cancel("s") is True
    assert first.cancel_requested and second.cancel_requested


def test_the_older_turn_stays_cancellable_after_the_newer_one_ends() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "a")
    first, second = TurnHandle("s", "turn-a"), TurnHandle("s", "turn-b")
    reg.turn_started(first)
    reg.turn_started(second)
    reg.turn_finished(second)
    assert reg.running("s") is first
    assert reg.running_count() == 1
    assert reg.reap(0.0, now=time.monotonic() + 10) == 0  # a turn still runs: not idle
    assert reg.cancel("s") is True and first.cancel_requested
    reg.turn_finished(first)
    assert reg.running("s") is None and reg.running_count() == 0


def test_cancel_all_reaches_both_turns_of_one_session() -> None:
    reg = SessionRegistry()
    first, second = TurnHandle("s", "turn-a"), TurnHandle("s", "turn-b")
    reg.turn_started(first)
    reg.turn_started(second)
    assert reg.cancel_all() == 2
    assert first.cancel_requested and second.cancel_requested


async def test_close_reserves_the_id_until_every_cancelled_turn_ends() -> None:
    reg = SessionRegistry()
    reg.get_or_create("s", "a")
    first, second = TurnHandle("s", "turn-a"), TurnHandle("s", "turn-b")
    reg.turn_started(first)
    reg.turn_started(second)
    reg.close("s")
    assert first.cancel_requested and second.cancel_requested
    waiter = asyncio.ensure_future(reg.until_closed("s"))
    reg.turn_finished(second)
    await asyncio.sleep(0)
    assert reg.closing("s") is not None and not waiter.done()  # turn-a still ends
    reg.turn_finished(first)
    await asyncio.wait_for(waiter, 5)
    assert reg.closing("s") is None


async def test_closing_a_session_only_the_store_holds_deletes_it_and_says_so() -> None:
    """contract.md §11.4: ``closed`` is true if a session record existed; a record the
    store keeps (after a restart, the idle reaper, another replica's turn) is one."""
    reg = SessionRegistry()
    reg.store.save(SessionRecord("s", "t"))
    assert reg.get("s") is None  # not loaded here
    assert await reg.close_any("s") is True
    assert await reg.store.load("s") is None  # deleted
    assert await reg.close_any("s") is False  # nothing left to close
    reg.get_or_create("live", "t")
    assert await reg.close_any("live") is True
    assert reg.get("live") is None
