"""The bounded event log behind bridge.watch (no sockets)."""

from __future__ import annotations

import asyncio

from xwm_bridge.core.watch import EventLog, WatchFilter, format_cursor, parse_cursor


def test_cursor_round_trip_and_garbage() -> None:
    assert parse_cursor(format_cursor("ab12", 7)) == ("ab12", 7)
    for bad in ("", "7", "ab:", ":3", "ab:x", "ab:-1"):
        assert parse_cursor(bad) is None, bad


def test_cursor_seq_is_ascii_digits_of_bounded_length() -> None:
    # str.isdigit() passes these, int() then raised ValueError (bridge.watch: -32603)
    for bad in ("ab:\u00b2", "ab:\u0661\u0662", "ab:" + "9" * 5000, "ab:" + "1" * 21):
        assert parse_cursor(bad) is None, bad[:20]
    assert parse_cursor("ab:" + "9" * 20) == ("ab", int("9" * 20))


def test_catchup_after_a_cursor_misses_nothing() -> None:
    log = EventLog(capacity=100)
    log.recording = True
    log.publish("turn", "started", {"n": 1}, "s1")
    cursor = log.cursor
    for n in range(2, 6):
        log.publish("turn", "update", {"n": n}, "s1")
    got = log.catchup(cursor)
    assert [e.data["n"] for e in got.events] == [2, 3, 4, 5] and got.reset is False
    assert log.catchup(log.cursor).events == []


def test_a_cursor_older_than_the_ring_or_another_process_is_a_reset() -> None:
    log = EventLog(capacity=3)
    log.recording = True
    cursor = log.cursor
    for n in range(10):
        log.publish("turn", "update", {"n": n})
    assert len(log) == 3  # bounded
    got = log.catchup(cursor)
    assert got.reset is True and [e.data["n"] for e in got.events] == [7, 8, 9]
    assert log.catchup(format_cursor("other", 2)).reset is True
    assert log.catchup(format_cursor(log.epoch, 10_000)).reset is True


def test_samples_have_their_own_ring() -> None:
    log = EventLog(capacity=4, samples=2)
    log.recording = True
    log.publish("session", "started", {}, "s1")
    for n in range(5):
        log.publish("metrics", "sample", {"n": n})
    assert len(log) == 1  # samples never push the events out
    assert [e.data["n"] for e in log.samples()] == [3, 4]
    fresh = log.catchup(None)
    assert [e.kind for e in fresh.events] == ["metrics", "metrics"]


def test_filters() -> None:
    log = EventLog()
    log.recording = True
    cursor = log.cursor
    log.publish("turn", "update", {}, "a")
    log.publish("turn", "update", {}, "b")
    log.publish("permission", "requested", {}, "a")
    only_a = log.catchup(cursor, WatchFilter(session_id="a"))
    assert [e.session_id for e in only_a.events] == ["a", "a"]
    perms = log.catchup(cursor, WatchFilter(frozenset({"permission"})))
    assert [e.kind for e in perms.events] == ["permission"]


async def test_a_slow_subscriber_overflows_instead_of_blocking() -> None:
    log = EventLog(max_pending=3)
    log.recording = True
    sub = log.subscribe()
    for n in range(3):
        log.publish("turn", "update", {"n": n})
    assert await sub.wait(0.01) and [e.data["n"] for e in sub.drain(10)] == [0, 1, 2]
    for n in range(5):  # publish never waits for the reader
        log.publish("turn", "update", {"n": n})
    assert sub.overflowed and not sub.pending
    log.unsubscribe(sub)
    assert log.subscribers == 0


async def test_wait_wakes_on_publish() -> None:
    log = EventLog()
    log.recording = True
    sub = log.subscribe()
    waiter = asyncio.ensure_future(sub.wait(5))
    await asyncio.sleep(0)
    log.publish("session", "closed", {}, "s")
    assert await asyncio.wait_for(waiter, 1) is True
    assert await sub.wait(0.01) is True  # still pending until drained
    sub.drain(10)
    assert await sub.wait(0.01) is False


def test_nothing_is_recorded_before_a_cursor_is_handed_out() -> None:
    """A bridge nobody watches pays nothing per turn; no cursor can predate recording."""
    log = EventLog()
    assert log.publish("turn", "started", {"n": 1}) is None
    assert log.publish("metrics", "sample", {"m": 1}) is not None  # the charts' history
    assert len(log) == 0 and log.head == 1
    cursor = log.cursor  # handed out: from here on, everything is kept
    log.publish("turn", "started", {"n": 2})
    caught = log.catchup(cursor)
    assert [e.data["n"] for e in caught.events] == [2] and caught.reset is False
    fresh = EventLog()
    fresh.subscribe()  # a watch starts recording too
    assert fresh.publish("turn", "started", {}) is not None
