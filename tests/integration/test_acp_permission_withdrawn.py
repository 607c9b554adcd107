"""The bridge settles a ``session/request_permission`` itself (a ``session/cancel`` of
the turn, ``agents.permission_timeout``, an operator's answer from the console): the
ACP client is told with ``$/cancel_request {requestId}`` (ACP request cancellation),
so its dialog can close, and its late answer is dropped without a word. Gated by
``acp.cancel_requests``: the pinned SDK's client logs an error on the notification.
The in-process daemon, the SDK's WebSocket client, the scripted fake agent."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from acp.schema import AllowedOutcome, RequestPermissionResponse

from tests.conftest import FakeUpstream, StartBridge, wait_until
from tests.integration.acp_helpers import RecordingClient, prompt
from tests.integration.test_acp_remote import config, sdk_client
from xwm_bridge.providers.stdio.permissions import PermissionAnswer

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

#: what the pinned SDK's client logs on a notification it has no route for
SDK_UNROUTED = "Unhandled error while handling notification method=$/cancel_request"


class LateClient(RecordingClient):
    """Keeps the dialog open until told, then allows: the user's answer comes late."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        self.permission_asked.set()
        await self.release.wait()
        option = next(o for o in options if o.kind == "allow_once")
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )


def _bridge_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The bridge's warnings and errors, but the one a cancelled turn always logs."""
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.name.startswith("xwm_bridge")
        and r.levelno >= logging.WARNING
        and getattr(r, "kind", "") != "cancelled"
    ]


@pytest.mark.parametrize("settled_by", ["cancel", "deadline", "console"])
async def test_the_client_is_told_when_the_bridge_settles_the_permission(
    settled_by: str,
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = config(
        fake_upstream, tmp_path, acp={"default_route": "single-agent:fake", "cancel_requests": True}
    )
    cfg["agents"]["permission_timeout"] = 1 if settled_by == "deadline" else 600
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    target = tmp_path / "out.txt"
    client = LateClient()
    async with sdk_client(f"{bp.url}/acp/remote", "ws", client) as (conn, _, checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            conn.prompt(session_id=session.session_id, prompt=prompt(f"permission {target}"))
        )
        await asyncio.wait_for(client.permission_asked.wait(), 30)
        (asked,) = checker.requests("session/request_permission")
        broker = bp.bridge.permissions
        if settled_by == "cancel":
            await conn.cancel(session_id=session.session_id)
        elif settled_by == "console":
            (record,) = broker.snapshot()
            allow = next(o for o in record.options if o["kind"] == "allow_once")
            broker.answer(PermissionAnswer(record.session_id, record.request_id, allow["optionId"]))
        done = await asyncio.wait_for(turn, 30)
        assert done.stop_reason == ("cancelled" if settled_by == "cancel" else "end_turn")
        await wait_until(lambda: bool(checker.requests("$/cancel_request")), within=10)
        (withdrawn,) = checker.requests("$/cancel_request")
        assert withdrawn["params"] == {"requestId": asked["id"]}
        written = target.exists()
        assert written is (settled_by == "console")  # only the operator allowed it
        (settled,) = broker.resolved  # the turn's one permission request
        resolution = settled.resolution

        client.release.set()  # the user answers the dialog after all: nothing happens
        await wait_until(lambda: asked["id"] in checker.answered, within=10)
        again = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=prompt("after")), 30
        )
        assert again.stop_reason == "end_turn"
    assert [r.resolution for r in broker.resolved] == [resolution]
    assert target.exists() is written and len(client.asked) == 1
    assert _bridge_logs(caplog) == []
    # the pinned SDK's client has no route for it and logs an error: hence the gate
    assert any(SDK_UNROUTED in r.getMessage() for r in caplog.records)


async def test_no_cancel_request_unless_configured(
    start_bridge: StartBridge,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``acp.cancel_requests`` off (the default): the dialog is not told, and the
    client's late answer is still dropped quietly."""
    cfg = config(fake_upstream, tmp_path, acp={"default_route": "single-agent:fake"})
    cfg["agents"]["permission_timeout"] = 600
    bp = await start_bridge(config=cfg, tmp=tmp_path)
    client = LateClient()
    async with sdk_client(f"{bp.url}/acp/remote", "ws", client) as (conn, _, checker):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        turn = asyncio.ensure_future(
            conn.prompt(
                session_id=session.session_id, prompt=prompt(f"permission {tmp_path / 'x'}")
            )
        )
        await asyncio.wait_for(client.permission_asked.wait(), 30)
        (asked,) = checker.requests("session/request_permission")
        await conn.cancel(session_id=session.session_id)
        assert (await asyncio.wait_for(turn, 30)).stop_reason == "cancelled"
        client.release.set()
        await wait_until(lambda: asked["id"] in checker.answered, within=10)
        again = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=prompt("after")), 30
        )
        assert again.stop_reason == "end_turn"
        assert checker.requests("$/cancel_request") == []
    assert _bridge_logs(caplog) == []
    assert not any(SDK_UNROUTED in r.getMessage() for r in caplog.records)
    assert not bp.bridge.permissions.snapshot()
