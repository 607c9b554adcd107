"""SessionFeed: live fan-out of ledger entries to catch-up streams."""

from __future__ import annotations

import pytest

from xwm_bridge.core.feed import SessionFeed

pytestmark = pytest.mark.asyncio


async def test_subscribers_get_entries_of_their_session_in_order() -> None:
    feed = SessionFeed()
    a, b = feed.subscribe("s1"), feed.subscribe("s2")
    feed.publish("s1", 2, {"n": 1})
    feed.publish("s2", 2, {"n": 9})
    feed.publish("s1", 3, {"n": 2})
    assert [a.queue.get_nowait(), a.queue.get_nowait()] == [(2, {"n": 1}), (3, {"n": 2})]
    assert b.queue.get_nowait() == (2, {"n": 9}) and a.queue.empty()
    feed.unsubscribe(a)
    feed.publish("s1", 4, {"n": 3})
    assert a.queue.empty() and len(feed) == 1
    feed.unsubscribe(b)
    assert len(feed) == 0


async def test_a_subscriber_that_falls_behind_is_marked_overflowed() -> None:
    feed = SessionFeed(max_pending=2)
    sub = feed.subscribe("s1")
    for n in range(5):
        feed.publish("s1", n, {"n": n})
    assert sub.overflowed and sub.queue.qsize() == 2
