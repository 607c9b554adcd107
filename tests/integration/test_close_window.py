"""A session id freed by ``session.close`` while its turn is still unwinding (the cancel
sent, the upstream's answer to it not yet in): the id stays reserved until that turn
has ended. A turn for the id on another thread, from any client, waits for it (at most
``limits.session_close_wait``, then ``-32004``), so two turns of one id never run at
once and the old turn's late notifications and result stay out of the new session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import (
    FakeUpstream,
    StartBridge,
    provider_env,
    session_params,
    wait_until,
)

TOKEN_A, TOKEN_B = "client-token-aaaa", "client-token-bbbb"


async def call(
    http: aiohttp.ClientSession, url: str, token: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        reply: dict[str, Any] = orjson.loads(await resp.read())
        return reply


def turns_upstream(fake: FakeUpstream, *threads: str) -> list[dict[str, Any]]:
    """The upstream turn requests of the given threads, in arrival order."""
    return [
        r
        for r in fake.state.requests
        if r["method"] in ("session.start", "session.message")
        and r["params"].get("threadId") in threads
    ]


async def unwinding_close(
    http: aiohttp.ClientSession, url: str, fake: FakeUpstream, sid: str
) -> asyncio.Task[dict[str, Any]]:
    """A's turn on ``sid``, closed by A; it stays in its cancellation (the upstream
    has the cancel, its answer is held) until ``fake.state.cancel_holds[sid]`` is set."""
    fake.state.holds[sid] = asyncio.Event()  # the turn runs until it is cancelled
    fake.state.cancel_holds[sid] = asyncio.Event()
    old = asyncio.create_task(call(http, url, TOKEN_A, "session.start", session_params(sid, "old")))
    await wait_until(lambda: sid in fake.state.active)
    closed = await call(http, url, TOKEN_A, "session.close", {"sessionId": sid})
    assert closed["result"] == {"accepted": True, "closed": True}
    await wait_until(lambda: any(c["sessionId"] == sid for c in fake.state.cancels))
    await wait_until(lambda: sid not in fake.state.active)  # the upstream turn is over
    del fake.state.holds[sid]  # later turns of the id answer at once
    assert not old.done()
    return old


def config(tmp: Path, **limits: Any) -> dict[str, Any]:
    return {
        "client_tokens": [TOKEN_A, TOKEN_B],
        "store": {"state_dir": str(tmp)},
        # the held cancel must not time out on a loaded machine
        "limits": {"upstream_cancel_timeout": 60, **limits},
    }


@pytest.mark.parametrize(
    ("token", "method"),
    [(TOKEN_B, "session.start"), (TOKEN_A, "session.message"), (TOKEN_A, "session.start")],
    ids=["another-client-starts", "same-client-continues", "same-client-restarts"],
)
async def test_a_closed_id_waits_for_its_last_turn(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    token: str,
    method: str,
) -> None:
    bridge = await start_bridge(
        env=provider_env(fake_upstream.url), config=config(tmp_path), tmp=tmp_path
    )
    url, sid = bridge.rpc_url, "s-reused"
    old = await unwinding_close(http, url, fake_upstream, sid)

    # a turn for the id on a thread of its own (on the closed turn's thread it would
    # simply queue behind it)
    new = asyncio.create_task(
        call(http, url, token, method, session_params(sid, "new", threadId="t-new"))
    )
    sessions = bridge.bridge.sessions

    def waiting() -> int:
        closing = getattr(sessions, "closing", lambda _: None)(sid)
        return int(closing.waiters) if closing is not None else 0

    # it waits in the bridge, never reaching the upstream, while the old turn unwinds
    await wait_until(lambda: waiting() == 1 or bool(turns_upstream(fake_upstream, "t-new")))
    assert turns_upstream(fake_upstream, "t-new") == []
    assert not new.done()

    fake_upstream.state.cancel_holds[sid].set()  # the old turn ends
    result = (await asyncio.wait_for(old, 10))["result"]
    assert result["cancelled"] is True
    reply = (await asyncio.wait_for(new, 10))["result"]
    assert reply["success"] is True
    assert len(turns_upstream(fake_upstream, "t-new")) == 1

    # the fresh session holds the new turn only, nothing of the closed one
    stored = await bridge.bridge.store.replay(sid, 0, 100)
    assert stored and {e.turn_id for e in stored} == {stored[0].turn_id}
    assert stored[0].turn_id != result["turnId"]
    assert waiting() == 0 and sessions.closing(sid) is None


async def test_a_closed_id_is_refused_when_its_last_turn_takes_too_long(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, session_close_wait=0.2)
    bridge = await start_bridge(env=provider_env(fake_upstream.url), config=cfg, tmp=tmp_path)
    url, sid = bridge.rpc_url, "s-slow-close"
    old = await unwinding_close(http, url, fake_upstream, sid)

    refused = await call(
        http, url, TOKEN_B, "session.start", session_params(sid, "b", threadId="t-b")
    )
    assert refused["error"] == {
        "code": -32004,
        "message": "session is closing: its last turn is still ending; retry when it has ended",
    }
    assert turns_upstream(fake_upstream, "t-b") == []

    fake_upstream.state.cancel_holds[sid].set()
    assert (await asyncio.wait_for(old, 10))["result"]["cancelled"] is True
    # once it has ended the id is free again
    again = await call(
        http, url, TOKEN_B, "session.start", session_params(sid, "b", threadId="t-b")
    )
    assert again["result"]["success"] is True
