"""The front door's live ACP sessions stay bounded, attached ones included."""

from __future__ import annotations

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
