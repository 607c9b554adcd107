"""The operator console in a real browser, continued: what the page holds and shows
while the bridge changes under it (tokens, answers in flight, long sessions)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge, rpc, wait_until
from tests.e2e.console_browser import (
    Watch,
    browser,
    codex,
    console_config,
    http_turn,
    login,
    open_console,
    refuse_once,
    require_browser,
    settle_turns,
)
from tests.integration.agent_helpers import agent_params

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
async def console(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any, Watch]]:
    async with open_console(start_bridge, fake_upstream, tmp_path) as opened:
        yield opened


@pytest.fixture(autouse=True)
async def _owned_turns(http: aiohttp.ClientSession) -> AsyncIterator[None]:
    yield  # needs http: its turns are settled before the client session closes
    await settle_turns()


async def test_a_client_token_is_told_it_needs_an_admin_token(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """With several principals, a client token passes console.auth but may not read the
    bridge-wide feeds (-32003): the page says so at the login, not "connecting…" forever
    with an uncaught error; an admin token then signs in."""
    require_browser()
    from tests.conftest import base_env

    env = base_env(
        ACP_AUTH_TOKEN=TOKEN,
        XWM_PROVIDER_CODEX_URL=fake_upstream.url,
        XWM_CLIENT_TOKENS="client-two",
        XWM_ADMIN_TOKENS="admin-one",
    )
    bp = await start_bridge(env=env, config=console_config(tmp_path), tmp=tmp_path)
    watch = Watch(bp.url)
    async with browser() as b:
        context = await b.new_context()
        context.on("page", watch.attach)
        page = await context.new_page()
        await page.goto(f"{bp.url}/console")
        await page.locator("#token").fill("client-two")
        await page.locator("#login-submit").click()
        error = page.locator("#login-error")
        await error.wait_for(state="visible")
        assert "admin token" in await error.inner_text()
        assert await page.locator("#main").is_hidden()
        assert await page.locator("#conn-text").inner_text() == "signed out"
        assert await page.evaluate("sessionStorage.length") == 0
        await login(page, bp.url, "admin-one")
        await context.close()
    assert watch.errors == [], watch.errors
    assert watch.foreign == [], watch.foreign


async def test_an_answer_in_the_session_view_survives_other_sessions_events(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A permission request answered from the open session's view: the page re-renders
    on any session's event, and that must neither give the buttons back while the answer
    is in flight (a second answer) nor drop the error of an answer that failed."""
    import json

    bp, context, _ = console
    page = await context.new_page()
    held: list[Any] = []  # (route, request id) of the first session.permission

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            msg = json.loads(message)
            if msg.get("method") == "session.permission" and not held:
                held.append((ws, msg["id"]))  # in flight until the test answers it
                return
            server.send(message)

        ws.on_message(from_page)

    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    turn = http_turn(
        http,
        bp.rpc_url,
        agent_params("sv-1", f"permission {tmp_path / 'sv.txt'}", workingDirectory=str(tmp_path)),
    )
    await page.goto(f"{bp.url}/console#/sessions/sv-1")
    button = page.locator('#turns button[data-option="once"]')
    await button.click()
    await wait_until(lambda: bool(held), within=10)  # the relay has it
    assert await button.is_disabled()
    # another session's turn: the page renders (its row appears)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("sv-other-1", "hi")), 30)
    await page.locator('[data-session="sv-other-1"]').wait_for()
    assert await button.is_disabled()  # still in flight
    ws, rid = held[0]
    err = {"code": -32603, "message": "held by replica r2, which did not answer"}
    ws.send(json.dumps({"jsonrpc": "2.0", "id": rid, "error": err}))
    error = page.locator("#turns .perm .error")
    await error.wait_for()
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("sv-other-2", "hi")), 30)
    await page.locator('[data-session="sv-other-2"]').wait_for()
    assert "did not answer" in await error.inner_text()  # still shown
    await button.click()  # enabled again: this one reaches the bridge
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"]


async def test_the_open_sessions_turns_stay_bounded(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A session left open while it runs turn after turn: the page keeps its newest 64
    turns (app.js MAX_TURNS, what the bridge keeps of a session), not every turn it saw."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("long-1", "turn 000")), 30)
    await page.goto(f"{bp.url}/console#/sessions/long-1")
    await page.locator('.turn[data-status="completed"]').wait_for()
    for i in range(1, 80):
        await rpc(http, bp.rpc_url, "session.message", codex("long-1", f"turn {i:03d}"))
    await page.locator(".turn .prompt", has_text="turn 079").wait_for()
    await page.wait_for_function("() => document.querySelectorAll('#turns .turn').length === 64")
    assert await page.evaluate("() => xwmConsole.held().turns") == 64
    assert await page.locator(".turn .prompt", has_text="turn 015").count() == 0  # the oldest went
    assert await page.locator(".turn .prompt", has_text="turn 016").count() == 1


async def test_a_filter_change_does_not_undo_newer_events(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A filter change re-reads session.list while the watch runs; a turn that starts
    after the bridge read that snapshot but before its answer reaches the page must stay
    running in the list (the snapshot's older row does not replace the newer event)."""
    import json

    bp, context, _ = console
    page = await context.new_page()
    asked: list[Any] = []
    held: list[Any] = []  # (route, answer) of the filter's session.list

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            msg = json.loads(message)
            if msg.get("method") == "session.list" and msg["params"].get("updatedSince"):
                asked.append(msg["id"])
            server.send(message)

        def from_server(message: str | bytes) -> None:
            msg = json.loads(message)
            if asked and msg.get("id") == asked[0] and not held:
                # a marker row, to see when the page has applied this answer
                msg["result"]["sessions"].append({"sessionId": "fc-marker", "state": "idle"})
                held.append((ws, msg))
                return
            ws.send(message)

        ws.on_message(from_page)
        server.on_message(from_server)

    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("fc-1", "hi")), 30)
    row = page.locator('[data-session="fc-1"] .pill')
    await page.locator('[data-session="fc-1"] .pill', has_text="completed").wait_for()
    await page.locator("#f-since").select_option("3600")  # still lists fc-1
    await wait_until(lambda: bool(held), within=10)  # answered by the bridge, not delivered
    turn = http_turn(http, bp.rpc_url, codex("fc-1", "slow:20000 still running"))
    await page.locator('[data-session="fc-1"] .pill', has_text="running").wait_for()
    ws, answer = held[0]
    ws.send(json.dumps(answer))
    await page.locator('[data-session="fc-marker"]').wait_for()
    assert await row.inner_text() == "running"
    await rpc(http, bp.rpc_url, "session.cancel", {"sessionId": "fc-1"})
    assert (await asyncio.wait_for(turn, 30))["result"]["cancelled"] is True


async def test_a_failed_cancel_says_why_next_to_the_button(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """session.cancel failing (an error answer, given here in the bridge's place) shows
    its message next to the Cancel turn button, enabled again, with no uncaught promise
    rejection; the next click reaches the bridge, and the error goes."""
    bp, context, watch = console
    page = await context.new_page()
    refused = await refuse_once(page, "session.cancel", "session store unavailable")
    await login(page, bp.url, TOKEN)
    params = agent_params("cf-1", "slow", workingDirectory=str(tmp_path))
    turn = http_turn(http, bp.rpc_url, params)
    await page.goto(f"{bp.url}/console#/sessions/cf-1")
    await page.locator('.turn[data-status="running"]').wait_for()
    cancel = page.locator("#cancel")
    await cancel.click()
    error = page.locator(".detail-head .error")
    await error.wait_for(timeout=10_000)
    assert "session store unavailable" in await error.inner_text()
    assert refused  # the relay answered it, not the bridge
    assert await cancel.is_enabled()
    assert watch.errors == [], watch.errors  # the rejection was caught
    await cancel.click()  # this one reaches the bridge
    assert (await asyncio.wait_for(turn, 30))["result"]["cancelled"] is True
    await page.locator('.turn[data-status="cancelled"]').wait_for()
    assert await error.count() == 0 or await error.is_hidden()


async def test_a_health_snapshot_does_not_undo_newer_events(console: Any) -> None:
    """After a reset the page re-reads bridge.health while the watch runs; a health event
    applied before that answer reaches the page is newer than it and must stay (the
    answer's older providers do not replace it), the rest of the answer is applied."""
    import json

    bp, context, _ = console
    page = await context.new_page()
    sockets: list[Any] = []
    holding: list[bool] = []
    asked: list[Any] = []
    held: list[Any] = []  # the answer to the reset's bridge.health, not delivered yet

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()
        sockets.append(ws)

        def from_page(message: str | bytes) -> None:
            msg = json.loads(message)
            if msg.get("method") == "bridge.health" and holding:
                asked.append(msg["id"])
            server.send(message)

        def from_server(message: str | bytes) -> None:
            msg = json.loads(message)
            if asked and msg.get("id") == asked[0] and not held:
                # a marker row, to see when the page has applied this answer
                marker = {"runtimeId": "hs-marker", "mode": "relay", "state": "connected"}
                msg["result"]["gateways"].append(marker)
                held.append(msg)
                return
            ws.send(message)

        ws.on_message(from_page)
        server.on_message(from_server)

    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/health")
    providers = page.locator("#t-providers")
    await providers.filter(has_text="codex").wait_for()
    holding.append(True)
    reset = {"kind": "watch", "type": "live", "reset": True}  # as after a too-old cursor
    sockets[-1].send(json.dumps({"jsonrpc": "2.0", "method": "bridge.event", "params": reset}))
    await wait_until(lambda: bool(held), within=10)  # answered by the bridge, not delivered
    fresh = {"id": "hs-fresh", "kind": "http", "state": "degraded", "turns": 3, "failures": 1}
    bp.bridge.events.publish("health", "changed", {"providers": [fresh]})
    await providers.filter(has_text="hs-fresh").wait_for()
    sockets[-1].send(json.dumps(held[0]))
    await page.locator("#t-gateways", has_text="hs-marker").wait_for()
    text = await providers.inner_text()
    assert "hs-fresh" in text and "codex" not in text, text
