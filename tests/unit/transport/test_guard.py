"""ConnectionGuard's send deadline without sockets: a connection whose writes stay
paused for ``send_timeout`` is aborted; one that resumes in time is not."""

from __future__ import annotations

import asyncio
from typing import Any

from xwm_bridge.transport.guard import ConnectionGuard

TIMEOUT = 0.1


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = asyncio.Event()
        self.aborted_at = 0.0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def abort(self) -> None:
        self.aborted_at = asyncio.get_running_loop().time()
        self.aborted.set()


def opened(guard: ConnectionGuard) -> tuple[object, FakeTransport]:
    handler, transport = object(), FakeTransport()
    assert guard.opened(handler, transport)
    return handler, transport


async def test_writes_paused_past_the_deadline_abort_the_connection() -> None:
    guard = ConnectionGuard(head_timeout=0, max_per_address=1, send_timeout=TIMEOUT)
    handler, transport = opened(guard)
    paused_at = asyncio.get_running_loop().time()
    guard.paused(handler)
    await asyncio.wait_for(transport.aborted.wait(), 5)
    assert transport.aborted_at - paused_at >= TIMEOUT * 0.99  # float rounding of the loop clock
    assert guard.closed == {"send_timeout": 1}
    guard.lost(handler)  # the abort's connection_lost: the slot comes back
    assert guard.open_count("127.0.0.1") == 0


async def test_the_deadline_counts_from_the_latest_pause() -> None:
    guard = ConnectionGuard(head_timeout=0, max_per_address=1, send_timeout=TIMEOUT)
    handler, transport = opened(guard)
    loop = asyncio.get_running_loop()
    guard.paused(handler)
    resumed = loop.create_future()
    loop.call_later(TIMEOUT / 2, resumed.set_result, None)
    await resumed
    guard.resumed(handler)  # the client took data: the first pause is over
    paused_again = loop.time()
    guard.paused(handler)
    await asyncio.wait_for(transport.aborted.wait(), 5)
    assert transport.aborted_at - paused_again >= TIMEOUT * 0.99  # float rounding of the loop clock


async def test_a_resumed_or_lost_connection_is_not_aborted() -> None:
    guard = ConnectionGuard(head_timeout=0, max_per_address=0, send_timeout=TIMEOUT)
    resumed, resumed_transport = opened(guard)
    lost, lost_transport = opened(guard)
    stalled, stalled_transport = opened(guard)
    for handler in (resumed, lost, stalled):
        guard.paused(handler)
    guard.resumed(resumed)
    guard.lost(lost)
    # the one left paused is aborted when its deadline passes: the others' were due too
    await asyncio.wait_for(stalled_transport.aborted.wait(), 5)
    await asyncio.sleep(0)  # any timer due at the same moment has run
    assert not resumed_transport.aborted.is_set()
    assert not lost_transport.aborted.is_set()
    assert guard.closed == {"send_timeout": 1}


async def test_no_send_timeout_means_no_deadline() -> None:
    guard = ConnectionGuard(head_timeout=0, max_per_address=0)
    handler, _ = opened(guard)
    guard.paused(handler)  # arms nothing
    assert guard.closed == {}
