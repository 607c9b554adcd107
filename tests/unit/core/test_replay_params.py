"""session.replay params and turn status bookkeeping (sans-I/O parts of issue 6)."""

from __future__ import annotations

import pytest

from xwm_bridge.core.handles import TurnHandle
from xwm_bridge.core.replay import ReplayParams
from xwm_bridge.core.sessions import Session
from xwm_bridge.core.turns import turn_status
from xwm_bridge.jsonrpc import RpcError
from xwm_bridge.store.base import emitted_pos, relayed_pos


def test_replay_params_defaults_and_cap() -> None:
    rp = ReplayParams.parse({"sessionId": "s"}, max_items=50)
    assert (rp.session_id, rp.after_seq, rp.limit) == ("s", 0, 50)
    rp = ReplayParams.parse({"sessionId": "s", "afterSeq": 7, "limit": 500}, max_items=50)
    assert (rp.after_seq, rp.limit, rp.after_event) == (7, 50, None)
    rp = ReplayParams.parse({"sessionId": "s", "afterEventId": 0}, max_items=50)
    assert rp.after_event == 0


@pytest.mark.parametrize(
    "params",
    [
        {"sessionId": "s", "afterSeq": 1.5},
        {"sessionId": "s", "limit": "x"},
        {"afterSeq": 1},
        {"sessionId": "s", "afterEventId": -1},
        {"sessionId": "s", "afterEventId": "3"},
    ],
)
def test_replay_params_reject_bad_types(params: dict[str, object]) -> None:
    with pytest.raises(RpcError) as info:
        ReplayParams.parse(params, max_items=50)
    assert info.value.code == -32602


def test_turn_status() -> None:
    handle = TurnHandle("s", "turn-1")
    assert turn_status({"success": True}, handle) == "completed"
    assert turn_status({"success": False}, handle) == "failed"
    assert turn_status(None, handle) == "failed"
    assert turn_status({"success": False, "cancelled": True}, handle) == "cancelled"
    handle.cancel_requested = True
    assert turn_status(None, handle) == "cancelled"


def test_positions_order_relayed_frames_after_their_update() -> None:
    assert emitted_pos(3) < relayed_pos(3) < emitted_pos(4)


def test_session_snapshot_round_trip() -> None:
    s = Session("s", "t", provider="codex", history=["a"], seq=5, events=9)
    s.last_turn_id, s.last_turn_status = "turn-1", "completed"
    s.upstream["acpSessionId"] = "x"
    back = Session.restore(s.snapshot())
    assert (back.thread_id, back.provider, back.history, back.seq) == ("t", "codex", ["a"], 5)
    assert back.upstream == {"acpSessionId": "x"} and back.last_turn_status == "completed"
    assert back.events == 9


def test_after_seq_past_the_ledger_range_is_invalid_params() -> None:
    """issue 16 item 4: afterSeq >= 2^63 used to overflow the store's integer (-32603)."""
    import pytest

    from xwm_bridge.core.replay import MAX_SEQ, ReplayParams
    from xwm_bridge.jsonrpc import RpcError

    assert ReplayParams.parse({"sessionId": "s", "afterSeq": MAX_SEQ}, 10).after_seq == MAX_SEQ
    for bad in (MAX_SEQ + 1, 2**63, 2**64 - 1):
        with pytest.raises(RpcError) as info:
            ReplayParams.parse({"sessionId": "s", "afterSeq": bad}, 10)
        assert info.value.code == -32602
