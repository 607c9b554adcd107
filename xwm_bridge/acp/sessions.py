"""ACP sessions of the front door: which client each is attached to, its route, and
what survives a restart.

An ACP session *is* a bridge session (same id, one thread): its turns, history,
ledger and ``seq`` live in :class:`~xwm_bridge.core.sessions.SessionRegistry` and the
store. The front door adds what ACP needs — ``cwd``, the route/model choice, a
title — kept in the record's upstream map under ``acp.*`` keys (so
``session/list`` and ``session/load`` work after a restart), and the *attachment*:
the connection that currently receives the session's updates. A dropped
connection detaches; the running turn goes on, and ``session/load`` or
``session/resume`` from a new connection attaches it again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from xwm_bridge.acp.options import Choice
from xwm_bridge.store.base import SessionRecord

CWD_KEY = "acp.cwd"
ROUTE_KEY = "acp.route"
MODEL_KEY = "acp.model"
TITLE_KEY = "acp.title"
#: the principal that created the session: only it lists, loads or resumes it
OWNER_KEY = "acp.owner"
#: sessions kept in memory (the store keeps them all): past it the least recently used
#: idle ones leave, detached ones first, then those of open connections (which are told)
MAX_LIVE_SESSIONS = 4096


class Client(Protocol):
    """The part of a connection a session sends through."""

    closed: bool

    async def send(self, message: dict[str, Any], scope: str | None) -> None: ...

    def serves(self, method: str) -> bool: ...

    def forget_session(self, session: AcpSession) -> None:
        """An idle session of this client left memory: reopen it from the store if
        the client uses it again."""


@dataclass(eq=False, slots=True)
class AcpSession:
    session_id: str
    cwd: str
    choice: Choice
    title: str = ""
    owner: str = ""
    client: Client | None = None
    #: while ``session/load`` replays: live updates wait here with their ledger position
    buffer: list[tuple[int | None, dict[str, Any]]] | None = None
    #: held by ``session/load`` from its attach to the end of its replay, and by
    #: ``session/resume`` to attach: one attach at a time, so a second load or a resume
    #: never takes the session (or its buffer) from a replay half done
    attaching: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: the client's ``mcpServers`` (validated; in memory only: env values may be secrets)
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    #: the prompts of this session running now (their relays, for cancel)
    turns: set[Any] = field(default_factory=set)
    last_used: float = field(default_factory=time.monotonic)

    def upstream_keys(self) -> dict[str, str]:
        keys = {CWD_KEY: self.cwd, ROUTE_KEY: self.choice.route, MODEL_KEY: self.choice.model}
        if self.title:
            keys[TITLE_KEY] = self.title
        if self.owner:
            keys[OWNER_KEY] = self.owner
        return keys

    async def deliver(self, message: dict[str, Any], pos: int | None = None) -> None:
        """Send a notification or request to the attached client (dropped when none:
        the ledger keeps the bridge's side for ``session/load``)."""
        if self.buffer is not None:
            self.buffer.append((pos, message))
            return
        client = self.client
        if client is not None and not client.closed:
            await client.send(message, self.session_id)

    async def end_replay(
        self, after_pos: int, send: Callable[[dict[str, Any]], Awaitable[None]]
    ) -> None:
        """Flush what arrived during the replay, skipping what the replay already held.

        Updates that arrive while the flush awaits the client join the buffer and go
        next: the session turns live only once the buffer is empty, so no live update
        overtakes a buffered one."""
        while self.buffer:  # None: the client detached meanwhile
            buffered, self.buffer = self.buffer, []
            for pos, message in buffered:
                if pos is None or pos > after_pos:
                    await send(message)
        self.buffer = None


def new_session_id() -> str:
    return f"acp-{uuid.uuid4().hex}"


def from_upstream(
    session_id: str, upstream: Mapping[str, str], default: Choice, cwd: str
) -> AcpSession:
    route = upstream.get(ROUTE_KEY) or default.route
    return AcpSession(
        session_id,
        upstream.get(CWD_KEY) or cwd,
        Choice(route, upstream.get(MODEL_KEY, "")),
        title=upstream.get(TITLE_KEY, ""),
        owner=upstream.get(OWNER_KEY, ""),
    )


def session_info(record: SessionRecord) -> dict[str, Any]:
    """A ``SessionInfo`` of ``session/list``."""
    up = dict(record.upstream)
    info: dict[str, Any] = {
        "sessionId": record.session_id,
        "cwd": up.get(CWD_KEY, ""),
        "updatedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.updated_at)),
        "_meta": {
            "xwm-bridge/route": up.get(ROUTE_KEY, ""),
            "xwm-bridge/lastTurnStatus": record.last_turn_status,
        },
    }
    if up.get(TITLE_KEY):
        info["title"] = up[TITLE_KEY]
    return info


class AcpSessions:
    """The front door's live sessions, bounded: least recently used idle sessions leave
    past ``max_live`` (detached ones first); one running a turn or replaying stays."""

    def __init__(self, max_live: int | None = None) -> None:
        self._max = MAX_LIVE_SESSIONS if max_live is None else max_live
        self._live: OrderedDict[str, AcpSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._live)

    def get(self, session_id: str) -> AcpSession | None:
        session = self._live.get(session_id)
        if session is not None:
            self._live.move_to_end(session_id)
            session.last_used = time.monotonic()
        return session

    def add(self, session: AcpSession) -> AcpSession:
        self._live[session.session_id] = session
        self._live.move_to_end(session.session_id)
        self._trim()
        return session

    def remove(self, session_id: str) -> AcpSession | None:
        return self._live.pop(session_id, None)

    def attached_to(self, client: Client) -> list[AcpSession]:
        return [s for s in self._live.values() if s.client is client]

    def _trim(self) -> None:
        if len(self._live) <= self._max:
            return
        for attached in (False, True):  # a connection can open sessions without bound
            for sid, session in list(self._live.items()):
                if len(self._live) <= self._max:
                    return
                if session.turns or session.buffer is not None or session.attaching.locked():
                    continue
                client = session.client
                if client is None or client.closed:
                    del self._live[sid]
                elif attached:
                    del self._live[sid]
                    session.client = None
                    client.forget_session(session)
