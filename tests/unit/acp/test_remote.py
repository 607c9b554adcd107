"""Streamable HTTP stream routing (sans-I/O): which stream each message goes to."""

from __future__ import annotations

import asyncio

import pytest

from xwm_bridge.acp import remote as remote_mod
from xwm_bridge.acp.remote import END, KEEPALIVE, Outbox, RemoteConnection


def note(sid: str, n: int) -> dict[str, object]:
    return {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "n": n}}


async def test_session_messages_follow_the_session_stream_once_it_exists() -> None:
    remote = RemoteConnection(capacity=8)
    remote.route(note("s1", 1), "s1")  # no stream for s1 yet: the connection stream
    assert len(remote.main) == 1
    remote.route({"jsonrpc": "2.0", "id": 2, "result": {"sessionId": "s2"}}, None)
    assert len(remote.main) == 2 and "s2" in remote.sessions  # session/new: s2 expected
    remote.route(note("s2", 1), "s2")
    assert len(remote.sessions["s2"]) == 1 and len(remote.main) == 2
    remote.session_box("s1")  # the client opened s1's stream
    remote.route(note("s1", 2), "s1")
    assert len(remote.sessions["s1"]) == 1


async def test_outbox_streams_keepalives_and_ends() -> None:
    box = Outbox(capacity=2)
    gen = box.attach()
    assert await box.get(gen, keepalive=0.01) == KEEPALIVE
    assert box.put({"n": 1}) and box.put({"n": 2})
    assert not box.put({"n": 3})  # full: the caller drops the connection
    assert await box.get(gen) == {"n": 1}
    newer = box.attach()  # a second GET takes over: the first stream ends
    assert await box.get(gen) == END
    assert await box.get(newer) == {"n": 2}
    waiter = asyncio.ensure_future(box.get(newer, keepalive=5))
    await asyncio.sleep(0)
    box.close()
    assert await waiter == END


async def test_a_full_buffer_breaks_the_connection() -> None:
    remote = RemoteConnection(capacity=1)
    remote.route(note("s1", 1), None)
    assert not remote.broken
    remote.route(note("s1", 2), None)
    assert remote.broken


def created(sid: str) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": sid, "result": {"sessionId": sid}}


async def test_session_streams_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_mod, "MAX_SESSION_STREAMS", 4, raising=False)
    remote = RemoteConnection(capacity=64)
    open_box = remote.session_box("s-open")
    open_box.attach()
    for n in range(20):  # session/new after session/new, streams never opened: kept empty
        remote.route(created(f"s{n}"), None)
    assert len(remote.sessions) == 4 and "s-open" in remote.sessions and "s19" in remote.sessions
    assert not remote.broken
    for sid in list(remote.sessions):  # every stream now holds a message nobody reads
        remote.route(note(sid, 1), sid)
    remote.route(created("s-more"), None)
    assert remote.broken  # the client reads none of them: closed as with a full buffer
