"""``session/load`` and ``session/resume`` of a session whose turn is streaming, at the same
moment, through the official SDK's WebSocket client on ``/acp/remote``.

The fake upstream streams the turn one chunk per ``Pace.step``, and the ledger read of each
load waits for the test after it has read, so the test decides what streams while which
replay is under way. The client that stays attached must see the replay, then every live
update after it: each once, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from internal.peers.fake_acp import Pace
from tests.acp_schema import FrameChecker
from tests.conftest import FakeUpstream, StartBridge, wait_until
from tests.integration.acp_helpers import prompt
from tests.integration.test_acp_remote import config, sdk_client
from xwm_bridge.acp.front import AcpFrontDoor
from xwm_bridge.acp.methods import AcpMethods
from xwm_bridge.acp.sessions import AcpSession

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

PROMPT = "a turn streamed in pieces while two clients load it"
OUTPUT = f"echo: {PROMPT}"
CHUNKS = 16
SIZE = -(-len(OUTPUT) // CHUNKS)
PIECES = [OUTPUT[i : i + SIZE] for i in range(0, len(OUTPUT), SIZE)]


class Stage:
    """The in-process bridge of one test, with its session's turn paced and its ledger
    reads held: ``reads[i]`` is entered when the i-th load has read the ledger, which it
    returns once ``release[i]`` is set."""

    def __init__(self, bp: Any, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bp = bp
        self.fake = fake
        self.monkeypatch = monkeypatch
        self.sid = ""
        self.pace = Pace()
        self.reads = [asyncio.Event() for _ in range(2)]
        self.release = [asyncio.Event() for _ in range(2)]
        #: how many times a load or resume of the session had reopened it
        self.reopened = 0

    @property
    def events(self) -> int:
        live = self.bp.bridge.sessions.get(self.sid)
        return int(live.events) if live is not None else 0

    async def stream(self, n: int) -> None:
        """Let ``n`` more chunks go and wait until the bridge recorded them."""
        before = self.events
        self.pace.step(n)
        await wait_until(lambda: self.events >= before + n, within=15)

    def hold_loads(self) -> None:
        store = self.bp.bridge.store
        real_replay = store.replay
        calls = 0

        async def replay(sid: str, after_seq: int, limit: int, **kw: Any) -> Any:
            nonlocal calls
            entries = await real_replay(sid, after_seq, limit, **kw)
            if sid == self.sid and kw.get("after_event") is None and calls < 2:
                i, calls = calls, calls + 1
                self.reads[i].set()
                await asyncio.wait_for(self.release[i].wait(), 30)
            return entries

        self.monkeypatch.setattr(store, "replay", replay)
        real_persist = AcpFrontDoor.persist

        async def persist(front: AcpFrontDoor, session: AcpSession) -> None:
            await real_persist(front, session)
            if session.session_id == self.sid:
                self.reopened += 1  # load and resume persist last, then attach

        self.monkeypatch.setattr(AcpFrontDoor, "persist", persist)


def segments(checker: FrameChecker) -> list[str]:
    """The agent text a client saw, cut where a replay began (its user message): the
    first item is what it saw before any replay."""
    out = [""]
    for update in checker.updates():
        kind = update["sessionUpdate"]
        if kind == "user_message_chunk":
            assert update["content"]["text"] == PROMPT
            out.append("")
        elif kind == "agent_message_chunk":
            out[-1] += update["content"]["text"]
    return out


async def streaming_turn(
    stage: Stage, url: str, tmp: Path, body: Callable[[], Awaitable[None]]
) -> None:
    """Open a session on its own connection, stream two chunks of a turn to it, run
    ``body`` (the loads), then let the turn finish."""
    async with sdk_client(url, "ws") as (owner, _, seen):
        session = await owner.new_session(cwd=str(tmp), mcp_servers=[])
        stage.sid = session.session_id
        stage.fake.state.paces[stage.sid] = stage.pace
        turn = asyncio.ensure_future(owner.prompt(session_id=stage.sid, prompt=prompt(PROMPT)))
        stage.pace.step(2)
        await wait_until(lambda: seen.text() == "".join(PIECES[:2]), within=15)
        stage.hold_loads()
        await body()
        stage.pace.open()
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "end_turn"


@pytest.fixture
def setup(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[], Awaitable[tuple[Stage, str]]]:
    async def make() -> tuple[Stage, str]:
        fake_upstream.state.chunks = CHUNKS
        bp = await start_bridge(config=config(fake_upstream, tmp_path), tmp=tmp_path)
        return Stage(bp, fake_upstream, monkeypatch), f"{bp.url}/acp/remote"

    return make


async def test_two_connections_loading_at_once_keep_every_live_update(
    setup: Callable[[], Awaitable[tuple[Stage, str]]], tmp_path: Path
) -> None:
    """The second load took the session while the first replayed: the first's end
    flushed what the second's replay lacked to the first connection, then live updates
    reached the second before its replay — it lost some and had others out of order."""
    stage, url = await setup()
    load = {"cwd": str(tmp_path), "mcp_servers": []}
    async with sdk_client(url, "ws") as (a, _, seen_a), sdk_client(url, "ws") as (b, _, seen_b):

        async def body() -> None:
            first = asyncio.ensure_future(a.load_session(session_id=stage.sid, **load))
            await asyncio.wait_for(stage.reads[0].wait(), 15)
            second = asyncio.ensure_future(b.load_session(session_id=stage.sid, **load))
            await wait_until(lambda: stage.reopened == 2, within=15)
            await stage.stream(3)  # while both loads are under way
            stage.release[0].set()
            await asyncio.wait_for(first, 15)
            await stage.stream(3)  # the first is done, the second is not
            stage.release[1].set()
            await asyncio.wait_for(second, 15)

        await streaming_turn(stage, url, tmp_path, body)
        await b.list_sessions()  # a round trip: every update of the turn has reached b
        await a.list_sessions()
        assert segments(seen_b) == ["", OUTPUT]  # the replay, then each live piece once
        before, first_seen = segments(seen_a)
        assert before == "" and OUTPUT.startswith(first_seen)  # until the second took over


async def test_one_connection_loading_twice_at_once_ends_with_every_live_update(
    setup: Callable[[], Awaitable[tuple[Stage, str]]], tmp_path: Path
) -> None:
    """The second load replaced the first's buffer and the first's end switched the
    session to live while the second still replayed: what streamed meanwhile was in
    neither the second's replay nor after it."""
    stage, url = await setup()
    load = {"cwd": str(tmp_path), "mcp_servers": []}
    async with sdk_client(url, "ws") as (a, _, seen):

        async def body() -> None:
            first = asyncio.ensure_future(a.load_session(session_id=stage.sid, **load))
            await asyncio.wait_for(stage.reads[0].wait(), 15)
            second = asyncio.ensure_future(a.load_session(session_id=stage.sid, **load))
            await wait_until(lambda: stage.reopened == 2, within=15)
            await stage.stream(3)
            stage.release[0].set()
            await asyncio.wait_for(first, 15)
            await stage.stream(3)
            stage.release[1].set()
            await asyncio.wait_for(second, 15)

        await streaming_turn(stage, url, tmp_path, body)
        await a.list_sessions()
        before, first, second = segments(seen)
        assert before == "" and OUTPUT.startswith(first)
        assert second == OUTPUT


async def test_a_resume_during_a_load_gets_every_update_after_its_answer(
    setup: Callable[[], Awaitable[tuple[Stage, str]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resume attached at once, but the load still buffered: its end flushed the
    updates streamed since to the loading connection, never to the resumed one."""
    stage, url = await setup()
    load = {"cwd": str(tmp_path), "mcp_servers": []}
    granted: list[int] = []  # chunks granted when the resume was answered
    real_resume = AcpMethods.session_resume

    async def resume(methods: AcpMethods, *args: Any) -> dict[str, Any]:
        result = await real_resume(methods, *args)
        granted.append(stage.pace.granted)
        return result

    monkeypatch.setattr(AcpMethods, "session_resume", resume)
    async with sdk_client(url, "ws") as (a, _, _seen_a), sdk_client(url, "ws") as (b, _, seen_b):

        async def body() -> None:
            loading = asyncio.ensure_future(a.load_session(session_id=stage.sid, **load))
            await asyncio.wait_for(stage.reads[0].wait(), 15)
            resuming = asyncio.ensure_future(b.resume_session(session_id=stage.sid, **load))
            await wait_until(lambda: stage.reopened == 2, within=15)
            await stage.stream(3)
            stage.release[0].set()
            await asyncio.wait_for(loading, 15)
            await asyncio.wait_for(resuming, 15)
            await stage.stream(3)

        await streaming_turn(stage, url, tmp_path, body)
        await b.list_sessions()
        assert len(granted) == 1
        text = seen_b.text()
        assert not [u for u in seen_b.updates() if u["sessionUpdate"] == "user_message_chunk"]
        assert OUTPUT.endswith(text)  # no replay: live updates only, in order, once each
        assert text.endswith("".join(PIECES[granted[0] :]))  # every one after its answer


async def test_a_final_answer_written_while_a_load_reads_the_ledger_is_sent_once(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider that streams nothing: its final output is the turn's one message chunk.
    It went to the loading client's buffer before it was written to the ledger, so a
    ledger read right after had it too, and the client got it twice (replay, then flush)."""
    cfg = config(fake_upstream, tmp_path)
    cfg["providers"][0]["stream"] = False  # codex: the final output only
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    url = f"{bp.url}/acp/remote"
    load = {"cwd": str(tmp_path), "mcp_servers": []}
    async with sdk_client(url, "ws") as (owner, _, _), sdk_client(url, "ws") as (b, _, seen):
        session = await owner.new_session(cwd=str(tmp_path), mcp_servers=[])
        sid = session.session_id
        turn = asyncio.ensure_future(owner.prompt(session_id=sid, prompt=prompt("slow:1500 quiet")))
        await wait_until(lambda: bool(fake_upstream.state.active), within=15)
        store = bp.bridge.store
        real_replay = store.replay
        reading, release = asyncio.Event(), asyncio.Event()

        async def replay(s: str, after_seq: int, limit: int, **kw: Any) -> Any:
            if s == sid and kw.get("after_event") is None and not reading.is_set():
                reading.set()  # the load has attached and buffers: it reads once released
                await asyncio.wait_for(release.wait(), 30)
            return await real_replay(s, after_seq, limit, **kw)

        monkeypatch.setattr(store, "replay", replay)
        loading = asyncio.ensure_future(b.load_session(session_id=sid, **load))
        await asyncio.wait_for(reading.wait(), 15)
        assert (await asyncio.wait_for(turn, 15)).stop_reason == "end_turn"  # answered
        release.set()
        await asyncio.wait_for(loading, 15)
        await b.list_sessions()  # a round trip: everything of the load has reached b
        texts = [u["content"]["text"] for u in seen.updates("agent_message_chunk")]
        assert len(texts) == 1, texts
