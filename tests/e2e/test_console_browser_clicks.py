"""The operator console in a real browser: clicks while the page re-renders. A click is
never fired when the node pressed left the document before the release, so every card a
button sits in is kept across renders and changed in place (static/turns.js, perms.js)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge
from tests.e2e.console_browser import Watch, http_turn, login, open_console, settle_turns
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


async def point_at(page: Any, selector: str) -> None:
    box = await page.locator(selector).bounding_box()
    assert box is not None, selector
    await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


async def test_a_permission_answer_in_the_open_session_survives_streamed_updates(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Allow pressed in the open session while its turn's updates re-render the page,
    released after: the answer reaches the bridge. The turn cards were rebuilt on every
    render, and the permission card moved into the new one left the document."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    target = tmp_path / "pressed.txt"
    params = agent_params("click-1", f"permission {target}", workingDirectory=str(tmp_path))
    turn = http_turn(http, bp.rpc_url, params)
    await page.goto(f"{bp.url}/console#/sessions/click-1")
    button = '#turns button[data-option="once"]'
    await page.locator(button).wait_for()
    turn_id = await page.locator("#turns .turn").first.get_attribute("data-turn")
    await point_at(page, button)
    await page.mouse.down()
    for i in range(3):  # the open turn's updates arrive: each one renders the page
        update = {"type": "tool_call", "toolCallId": f"tc-{i}", "title": f"streamed {i}"}
        data = {"turnId": turn_id, "relayed": False, "eventId": 10_000 + i, "update": update}
        bp.bridge.events.publish("turn", "update", data, "click-1")
        await page.locator("#turns .item", has_text=f"streamed {i}").wait_for()
    await point_at(page, button)  # back on it (the tool calls arrive below it now)
    await page.mouse.up()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"] and target.exists()


async def test_a_permission_answer_in_the_permissions_view_survives_a_new_request(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Allow pressed in the Permissions view while another request arrives (the list is
    re-rendered with one more card), released after: the answer reaches the bridge. A
    changed list put every card back (replaceChildren), the pressed one with them."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/permissions")
    target = tmp_path / "pressed.txt"
    params = agent_params("click-2", f"permission {target}", workingDirectory=str(tmp_path))
    turn = http_turn(http, bp.rpc_url, params)
    button = '#perm-pending button[data-option="once"]'
    await page.locator(button).wait_for()
    await point_at(page, button)
    await page.mouse.down()
    other = {
        "sessionId": "click-other",
        "requestId": "req-other",
        "turnId": "t-other",
        "toolCall": {"title": "another request"},
        "options": [{"optionId": "x", "name": "X", "kind": "allow_once"}],
        "createdAt": 1,  # the oldest: listed after the pressed card, which stays put
        "state": "pending",
    }
    bp.bridge.events.publish("permission", "requested", other, "click-other")
    await page.locator('#perm-pending [data-request="req-other"]').wait_for()
    await page.mouse.up()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"] and target.exists()


async def test_a_pending_permission_stays_under_the_pointer_while_the_turn_goes_on(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The pointer on Allow while the turn's tool calls and output arrive, then a press
    and release where it is (no move back): the answer reaches the bridge. The pending
    card sat below the tool calls and output, so each new one pushed the button away
    from under the pointer, and the press landed on whatever moved there."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    target = tmp_path / "still.txt"
    params = agent_params("click-3", f"permission {target}", workingDirectory=str(tmp_path))
    turn = http_turn(http, bp.rpc_url, params)
    await page.goto(f"{bp.url}/console#/sessions/click-3")
    button = '#turns button[data-option="once"]'
    await page.locator(button).wait_for()
    turn_id = await page.locator("#turns .turn").first.get_attribute("data-turn")
    await point_at(page, button)
    before = await page.locator(button).bounding_box()
    for i in range(4):  # the turn goes on while the operator is about to press
        update = {"type": "tool_call", "toolCallId": f"tc-{i}", "title": f"arrived {i}"}
        data = {"turnId": turn_id, "relayed": False, "eventId": 20_000 + i, "update": update}
        bp.bridge.events.publish("turn", "update", data, "click-3")
        await page.locator("#turns .item", has_text=f"arrived {i}").wait_for()
    plan = {"type": "plan", "entries": [{"content": "step", "status": "pending"}]}
    delta = {"type": "delta", "delta": "streamed line\n" * 8}
    for n, update in enumerate((plan, delta)):
        data = {"turnId": turn_id, "relayed": False, "eventId": 20_010 + n, "update": update}
        bp.bridge.events.publish("turn", "update", data, "click-3")
    await page.locator("#turns .plan li", has_text="step").wait_for()
    await page.locator("#turns .output", has_text="streamed line").wait_for()
    assert await page.locator(button).bounding_box() == before
    await page.mouse.down()
    await page.mouse.up()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"] and target.exists()
