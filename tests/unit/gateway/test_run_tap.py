"""RunTap: the bounded queue of one gateway run's events (gateway/turns.py)."""

from __future__ import annotations

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway.turns import RunTap


def chat(state: str, seq: int, run_id: str = "r1") -> p.EventFrame:
    payload = {"sessionKey": "agent:main:xwm-s1", "runId": run_id, "state": state}
    return p.EventFrame("chat", payload, seq)


def drain(tap: RunTap) -> list[p.EventFrame]:
    out = []
    while not tap.queue.empty():
        out.append(tap.queue.get_nowait())
    return out


def test_a_full_queue_drops_deltas_but_never_the_run_s_end() -> None:
    for end in ("final", "aborted", "error"):
        tap = RunTap("agent:main:xwm-s1", run_id="r1")
        size = tap.queue.maxsize
        for seq in range(size + 10):  # a runaway stream: the last 10 deltas are dropped
            tap(chat("delta", seq))
        tap(chat(end, size + 10))
        events = drain(tap)
        assert len(events) == size
        assert events[-1].payload["state"] == end  # the turn ends when the run does
        assert [e.seq for e in events[:-1]] == list(range(1, size))  # oldest delta made room


def test_other_runs_and_events_stay_out() -> None:
    tap = RunTap("agent:main:xwm-s1", run_id="r1")
    tap(chat("final", 1, run_id="r2"))
    tap(p.EventFrame("presence", {}, 2))
    assert drain(tap) == []
