"""The Streamable HTTP side of the ACP remote transport, without the HTTP.

Per the RFD, a connection (``Acp-Connection-Id``) has one connection-scoped SSE
stream and one stream per session (``Acp-Session-Id``). :class:`RemoteConnection`
decides which stream each outgoing message goes to and buffers messages for a
stream that is not open (yet); ``transport/acp_remote.py`` moves the bytes.

Routing: answers to connection-level requests (``initialize`` is answered in the
POST itself, ``session/new``, ``session/load``, ``session/resume``,
``session/list``, ``authenticate``) and messages of no session go to the
connection stream; everything of a session goes to that session's stream once it
exists — it is created when the client opens it, or when ``session/new`` answers
(the client opens it next). Until then, messages of a session go to the
connection stream: a client that never opens session streams gets those of the
sessions it loaded or resumed there, but not those of one it created (they wait in
its stream until the client opens it, or the buffer fills and the connection breaks).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from xwm_bridge.acp.connection import AcpConnection
from xwm_bridge.tasks import wait_for

#: what :meth:`Outbox.get` returns instead of a message
KEEPALIVE = "keepalive"
END = "end"
KEEPALIVE_INTERVAL = 15.0
#: session streams one connection keeps: past it, one not open and empty is dropped
#: (its session's messages go on the connection stream again)
MAX_SESSION_STREAMS = 1024


class Outbox:
    """The messages of one SSE stream; at most one stream reads it at a time."""

    def __init__(self, capacity: int) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._capacity = capacity
        self._wake = asyncio.Event()
        self.generation = 0
        self.attached = False
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, message: dict[str, Any]) -> bool:
        """False when full (the client stopped reading)."""
        if self.closed:
            return True
        if len(self._items) >= self._capacity:
            return False
        self._items.append(message)
        self._wake.set()
        return True

    def attach(self) -> int:
        """A new GET takes the stream over (an older one for the same scope ends)."""
        self.generation += 1
        self.attached = True
        self._wake.set()
        return self.generation

    def detach(self, generation: int) -> None:
        if generation == self.generation:
            self.attached = False

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    async def get(self, generation: int, keepalive: float | None = None) -> dict[str, Any] | str:
        while True:
            if self.closed or generation != self.generation:
                return END
            if self._items:
                return self._items.popleft()
            self._wake.clear()
            try:
                await wait_for(self._wake.wait(), keepalive or KEEPALIVE_INTERVAL)
            except TimeoutError:
                return KEEPALIVE


@dataclass(eq=False)
class RemoteConnection:
    capacity: int
    #: the principal that opened the connection (initialize): only it may use the id
    principal: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    main: Outbox = field(init=False)
    sessions: dict[str, Outbox] = field(default_factory=dict)
    last_activity: float = field(default_factory=time.monotonic)
    broken: bool = False
    conn: AcpConnection | None = None

    def __post_init__(self) -> None:
        self.main = Outbox(self.capacity)

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    @property
    def streaming(self) -> bool:
        return self.main.attached or any(box.attached for box in self.sessions.values())

    def session_box(self, session_id: str) -> Outbox:
        box = self.sessions.get(session_id)
        if box is None:
            self._make_room()
            box = self.sessions[session_id] = Outbox(self.capacity)
        return box

    def _make_room(self) -> None:
        """Keep at most :data:`MAX_SESSION_STREAMS` session streams: drop the oldest one
        not open and empty; when every one is open or holds unread messages, the client
        is not reading them — the connection is broken, as with a full buffer."""
        if len(self.sessions) < MAX_SESSION_STREAMS:
            return
        for sid, box in self.sessions.items():
            if not box.attached and not len(box):
                del self.sessions[sid]
                box.close()
                return
        self.broken = True

    def route(self, message: dict[str, Any], scope: str | None) -> None:
        """Queue one outgoing message on its stream; mark the connection broken when a
        stream's buffer is full."""
        result = message.get("result")
        created = result.get("sessionId") if isinstance(result, dict) and "id" in message else None
        box = self.main
        if scope is not None and scope in self.sessions:
            box = self.sessions[scope]
        if not box.put(message):
            self.broken = True
        if isinstance(created, str) and created:
            self.session_box(created)  # session/new: the client opens this stream next

    def close(self) -> None:
        self.main.close()
        for box in self.sessions.values():
            box.close()
