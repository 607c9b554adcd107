"""SessionFeed: live fan-out of ledger entries to catch-up streams."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import wait_until
from xwm_bridge.core.feed import SessionFeed
from xwm_bridge.store.base import LedgerEntry

pytestmark = pytest.mark.asyncio


def entry(event_id: int, **message: int) -> LedgerEntry:
    return LedgerEntry(2 * event_id, "turn-1", dict(message), 0.0, event_id)


async def test_subscribers_get_entries_of_their_session_in_order() -> None:
    feed = SessionFeed()
    a, b = feed.subscribe("s1"), feed.subscribe("s2")
    feed.publish("s1", entry(1, n=1))
    feed.publish("s2", entry(1, n=9))
    feed.publish("s1", entry(2, n=2))
    assert [await a.next(1), await a.next(1)] == [entry(1, n=1), entry(2, n=2)]
    assert await b.next(1) == entry(1, n=9)
    assert await a.next(0.01) is None  # nothing more: times out
    feed.unsubscribe(a)
    feed.publish("s1", entry(3, n=3))
    assert not a.pending and len(feed) == 1
    feed.unsubscribe(b)
    assert len(feed) == 0


async def test_a_subscriber_that_falls_behind_is_marked_overflowed() -> None:
    feed = SessionFeed(max_pending=2)
    sub = feed.subscribe("s1")
    for n in range(5):
        feed.publish("s1", entry(n + 1, n=n))
    assert sub.overflowed and len(sub.pending) == 2
    assert await sub.next(1) is None  # the stream ends; the client reconnects


async def test_next_wakes_on_publish() -> None:
    feed = SessionFeed()
    sub = feed.subscribe("s1")
    waiter = asyncio.get_running_loop().create_task(sub.next(5))
    await wait_until(lambda: bool(sub._ready._waiters))  # next() is blocked on its event
    assert not waiter.done()
    feed.publish("s1", entry(1, n=1))
    assert await asyncio.wait_for(waiter, 1) == entry(1, n=1)


async def test_drop_overlap_removes_live_entries_already_read() -> None:
    from xwm_bridge.transport.events import drop_overlap

    feed = SessionFeed()
    sub = feed.subscribe("s1")
    for i in (6, 7, 8):
        feed.publish("s1", entry(i, p=i))
    missed = [entry(i, p=i) for i in (4, 5, 6, 7)]
    drop_overlap(missed, sub)
    assert list(sub.pending) == [entry(8, p=8)]
    other = feed.subscribe("s2")
    feed.publish("s2", entry(9, p=9))
    drop_overlap([entry(4, p=4)], other)  # no overlap: nothing dropped
    assert list(other.pending) == [entry(9, p=9)]


async def test_parse_after_precedence() -> None:
    from xwm_bridge.transport.events import parse_after

    assert parse_after(None, None, None) == (0, None)
    assert parse_after(None, None, "4") == (4, None)  # ?afterSeq: by bridge seq
    assert parse_after(None, "7", "4") == (0, 7)  # ?afterEventId wins
    assert parse_after("9", "7", "4") == (0, 9)  # Last-Event-ID wins
    assert parse_after("x", None, None) is None
    assert parse_after(None, None, "-1") is None
