"""The front door's live ACP sessions stay bounded, attached ones included; a load's
replay hands over to live updates in order."""

from __future__ import annotations

import asyncio
from typing import Any

from xwm_bridge.acp.options import Choice
from xwm_bridge.acp.sessions import AcpSession, AcpSessions


class OpenClient:
    closed = False

    def __init__(self) -> None:
        self.evicted: list[str] = []

    async def send(self, message: dict[str, Any], scope: str | None) -> None:
        return None

    def serves(self, method: str) -> bool:
        return False

    def forget_session(self, session: AcpSession) -> None:
        self.evicted.append(session.session_id)


def session(sid: str, client: OpenClient | None = None) -> AcpSession:
    return AcpSession(sid, "/w", Choice("single-agent:codex"), client=client)


def test_detached_idle_sessions_go_first() -> None:
    live = AcpSessions(max_live=2)
    client = OpenClient()
    live.add(session("a", client))
    live.add(session("b"))
    live.add(session("c", client))
    assert live.get("b") is None and live.get("a") is not None and live.get("c") is not None
    assert client.evicted == []


def test_one_connection_cannot_grow_the_live_sessions_without_bound() -> None:
    live = AcpSessions(max_live=2)
    client = OpenClient()
    for sid in ("a", "b", "c", "d"):
        live.add(session(sid, client))
    assert len(live) == 2
    assert live.get("a") is None and live.get("b") is None
    # the connection is told, so a prompt on it reopens the session from the store
    assert client.evicted == ["a", "b"]


def test_sessions_running_a_turn_are_kept() -> None:
    live = AcpSessions(max_live=2)
    client = OpenClient()
    busy = live.add(session("busy", client))  # the least recently used, but running
    busy.turns.add(object())
    live.add(session("idle", client))
    live.add(session("next", client))
    assert live.get("busy") is busy and live.get("next") is not None
    assert live.get("idle") is None and client.evicted == ["idle"]


async def test_a_session_being_attached_is_kept() -> None:
    """A load waiting for another's replay holds the session object: had it left memory,
    a second object of the same id would take the next attach and the turn's updates."""
    live = AcpSessions(max_live=1)
    waiting = live.add(session("waiting"))  # detached and idle, but a load is attaching it
    async with waiting.attaching:
        live.add(session("other"))
        assert live.get("waiting") is waiting


class RecordingClient(OpenClient):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def send(self, message: dict[str, Any], scope: str | None) -> None:
        self.log.append(message["n"])


async def test_a_live_update_during_the_flush_waits_for_the_buffered_ones() -> None:
    """end_replay took the buffer and turned the session live before sending it: an
    update that came while the client was slow to take a buffered one overtook the rest."""
    log: list[str] = []
    live = session("s", RecordingClient(log))
    live.buffer = [(5, {"n": "old"}), (6, {"n": "b1"}), (7, {"n": "b2"})]
    writing, written = asyncio.Event(), asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["n"] == "b1":  # the client is slow to take it (a full socket buffer)
            writing.set()
            await written.wait()
        log.append(message["n"])

    flushing = asyncio.ensure_future(live.end_replay(5, send))
    await asyncio.wait_for(writing.wait(), 5)
    await live.deliver({"n": "live"}, 8)  # the turn goes on meanwhile
    written.set()
    await asyncio.wait_for(flushing, 5)
    assert log == ["b1", "b2", "live"]
    assert live.buffer is None
    await live.deliver({"n": "after"}, 9)
    assert log[-1] == "after"
