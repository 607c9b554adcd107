"""The operator console in a real browser (issue 13): Debian's chromium, Playwright,
the real daemon with the fake upstream and the scripted ACP agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge, rpc
from tests.e2e.console_browser import (
    Watch,
    codex,
    http_turn,
    login,
    open_console,
    refuse_once,
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


async def test_login_refuses_a_wrong_token(console: Any) -> None:
    bp, context, _ = console
    page = await context.new_page()
    await page.goto(f"{bp.url}/console")
    await page.locator("#login").wait_for(state="visible")
    await page.locator("#token").fill("not-the-token")
    await page.locator("#login-submit").click()
    await page.locator("#login-error").wait_for(state="visible")
    assert "refused" in await page.locator("#login-error").inner_text()
    assert await page.locator("#main").is_hidden()
    assert await page.evaluate("sessionStorage.length") == 0
    await login(page, bp.url, TOKEN)
    assert TOKEN not in page.url
    assert await page.evaluate("sessionStorage.getItem('xwm-bridge-token')") == TOKEN


async def test_the_page_refuses_markup_from_its_scripts(console: Any) -> None:
    """Defence in depth for the textContent-only rule: under the CSP's Trusted Types
    (``require-trusted-types-for 'script'; trusted-types 'none'``) a string given to an
    HTML sink (innerHTML, insertAdjacentHTML, document.write) throws in the page, so a
    change that rendered a bridge string as markup fails at once instead of running it."""
    bp, context, watch = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    blocked = await page.evaluate(
        """() => {
          const markup = "<img src=x onerror=window.__xss=1>";
          try { document.body.insertAdjacentHTML("beforeend", markup); }
          catch (e) { return e instanceof TypeError; }
          return false;
        }"""
    )
    assert blocked is True
    await page.locator("#conn.live").wait_for()  # the page itself still works
    watch.errors[:] = [e for e in watch.errors if "TrustedHTML" not in e]  # this test's own


async def test_http_turn_appears_grows_and_finishes(
    console: Any, http: aiohttp.ClientSession
) -> None:
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    turn = http_turn(http, bp.rpc_url, codex("web-1", "drip:400 the output grows bit by bit"))
    row = page.locator('[data-session="web-1"]')
    await row.wait_for()
    await row.click()
    out = page.locator("pre[data-turn-output]").first
    await page.wait_for_function(
        "() => { const t = document.querySelector('pre[data-turn-output]');"
        " return t && t.textContent.startsWith('echo:') && t.textContent.length < 39 }"
    )
    partial = await out.inner_text()
    await asyncio.wait_for(turn, 30)
    await page.locator('.turn[data-status="completed"]').wait_for()
    final = await page.locator("pre[data-turn-output]").first.inner_text()
    assert final == "echo: the output grows bit by bit"
    assert len(partial) < len(final)
    assert "completed" in await page.locator('[data-session="web-1"] .pill').inner_text()


async def test_approve_and_reject_in_the_page(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/permissions")
    target = tmp_path / "approved.txt"
    turn = http_turn(
        http,
        bp.rpc_url,
        agent_params("pa-1", f"permission {target}", workingDirectory=str(tmp_path)),
    )
    await page.locator('#perm-pending button[data-option="once"]').click()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"] and target.exists()
    await page.locator("#perm-resolved .perm.resolved").first.wait_for()
    text = await page.locator("#perm-resolved .perm").first.inner_text()
    assert "allow_once" in text and "console" in text

    turn = http_turn(
        http,
        bp.rpc_url,
        agent_params("pa-2", f"permission {tmp_path / 'no.txt'}", workingDirectory=str(tmp_path)),
    )
    await page.locator('#perm-pending button[data-option="reject"]').click()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission denied" in result["output"]
    assert result["permissions"][0]["outcome"] == "reject_once"
    assert not (tmp_path / "no.txt").exists()


async def test_two_pages_one_answer(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp, context, _ = console
    first, second = await context.new_page(), await context.new_page()
    for page in (first, second):
        await login(page, bp.url, TOKEN)
        await page.goto(f"{bp.url}/console#/permissions")
    turn = http_turn(
        http,
        bp.rpc_url,
        agent_params("two-1", f"permission {tmp_path / 'x'}", workingDirectory=str(tmp_path)),
    )
    await second.locator('#perm-pending button[data-option="once"]').wait_for()
    await first.locator('#perm-pending button[data-option="once"]').click()
    # the other page sees it resolved, greyed out, with who answered
    resolved = second.locator("#perm-resolved .perm.resolved").first
    await resolved.wait_for()
    assert "console 127.0.0.1:" in await resolved.inner_text()
    assert await second.locator("#perm-pending .perm").count() == 0
    await asyncio.wait_for(turn, 30)


async def test_cancel_a_running_turn(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    turn = http_turn(http, bp.rpc_url, agent_params("cx-1", "slow", workingDirectory=str(tmp_path)))
    await page.goto(f"{bp.url}/console#/sessions/cx-1")
    await page.locator('.turn[data-status="running"]').wait_for()
    await page.locator("#cancel").click()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert result["cancelled"] is True
    await page.locator('.turn[data-status="cancelled"]').wait_for()


async def test_a_session_opened_before_its_turn_starts(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """The page asks for a session that does not exist yet (a link to a turn on its way):
    an empty view, which the watch fills in when the turn starts."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/sessions/early-1")
    await page.locator("#detail-body").wait_for()
    assert await page.locator("#d-title").inner_text() == "early-1"
    turn = http_turn(http, bp.rpc_url, codex("early-1", "drip:200 opened before it started"))
    await asyncio.wait_for(turn, 30)
    await page.locator('.turn[data-status="completed"]').wait_for()
    text = await page.locator("pre[data-turn-output]").first.inner_text()
    assert text == "echo: opened before it started"


async def test_a_finished_turn_reads_only_the_newest_turns(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """When a turn of the open session finishes, the page reads its result with
    ``session.get`` asking for the newest two turns, not the session's whole history of
    up to 64 turns (each result up to 64 KiB: megabytes per finished turn)."""
    bp, context, _ = console
    page = await context.new_page()
    sent: list[dict[str, Any]] = []

    def on_socket(ws: Any) -> None:
        ws.on("framesent", lambda payload: sent.append(orjson.loads(payload)))

    page.on("websocket", on_socket)
    await login(page, bp.url, TOKEN)
    for i in range(3):
        await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("fin-1", f"earlier {i}")), 30)
    await page.goto(f"{bp.url}/console#/sessions/fin-1")
    await page.locator('.turn[data-status="completed"]').first.wait_for()
    opened = len(sent)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("fin-1", "the newest")), 30)
    await page.wait_for_function(
        "() => [...document.querySelectorAll('.turn')].some((t) =>"
        ' t.textContent.includes(\'"output": "echo: the newest"\'))'
    )
    gets = [f for f in sent[opened:] if f.get("method") == "session.get"]
    assert gets and all(f["params"].get("turns") == 2 for f in gets), gets


async def test_reload_mid_turn_loses_nothing(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    turn = http_turn(
        http, bp.rpc_url, agent_params("rl-1", "drip 8 250", workingDirectory=str(tmp_path))
    )
    await page.goto(f"{bp.url}/console#/sessions/rl-1")
    await page.wait_for_function(
        "() => (document.querySelector('pre[data-turn-output]') || {})"
        ".textContent?.includes('chunk 2')"
    )
    await page.reload()  # the token is in sessionStorage: no login again
    await page.locator("#conn.live").wait_for()
    await asyncio.wait_for(turn, 30)
    await page.locator('.turn[data-status="completed"]').wait_for()
    text = await page.locator("pre[data-turn-output]").first.inner_text()
    assert text.split() == " ".join(f"chunk {i}" for i in range(1, 9)).split()


async def test_an_agents_malformed_tool_call_and_plan_render_as_text(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A permission request whose toolCall.locations is an object (not a list) and a plan
    with entries that are not objects: both valid JSON from a buggy or hostile agent. The
    page still shows them (markup as text, no script run, a bidi override shown as
    ``\\u202e``, not applied) and the operator answers."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/permissions")
    turn = http_turn(
        http, bp.rpc_url, agent_params("odd-1", "oddpermission", workingDirectory=str(tmp_path))
    )
    button = page.locator('#perm-pending button[data-option="once"]')
    await button.wait_for()
    card = page.locator("#perm-pending .perm").first
    title = await card.locator(".title").inner_text()
    assert "<img src=x" in title
    # the bidi override is shown, not applied: the card said "…x.png" of "gnp.x"
    assert title.endswith("\\u202egnp.x") and "\u202e" not in title
    assert "<script>" in await button.inner_text()
    await button.click()
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "odd permission: once" in result["output"]
    await page.locator("#perm-resolved .perm.resolved").first.wait_for()

    await page.goto(f"{bp.url}/console#/sessions/odd-1")
    await page.locator('.turn[data-status="completed"]').wait_for()
    plan = await page.locator(".turn ul.plan").first.inner_text()
    assert "a bare string" in plan and "<script>" in plan
    assert await page.evaluate("window.__xss") is None


async def test_bidi_controls_in_any_text_are_shown_not_applied(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A bidi override in what a client or an agent wrote, anywhere the page shows it (the
    session list's row, the session's title, the prompt, the output): shown as
    ``\\u202e``, never applied (applied, "x.png" reads as "gnp.x", CVE-2021-42574). It
    was escaped on permission cards and tool titles only."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    sid = "bidi-\u202egnp.x"
    await asyncio.wait_for(
        http_turn(http, bp.rpc_url, codex(sid, "open \u2066this\u2069 file")), 30
    )
    row = page.locator("[data-session]").filter(has_text="bidi-")
    await row.first.wait_for()
    listed = await page.locator("#main").inner_text()
    assert "bidi-\\u202egnp.x" in listed and "\u202e" not in listed
    await row.first.click()
    await page.locator('.turn[data-status="completed"]').wait_for()
    shown = await page.locator("#main").inner_text()
    assert "\u202e" not in shown and "\u2066" not in shown and "\u2069" not in shown
    assert "echo: open \\u2066this\\u2069 file" in shown
    assert "bidi-\\u202egnp.x" in await page.locator("#d-title").inner_text()


async def test_a_link_with_a_broken_escape_still_goes_live(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A session link whose hash is not valid percent-encoding (a truncated paste): the
    page opens it as written, and the watch starts (the feed stays live)."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/sessions/bad%E0%A4%A")
    await page.reload()  # start() with that hash: the route, then the watch
    await page.locator("#conn.live").wait_for()
    assert await page.locator("#d-title").inner_text() == "bad%E0%A4%A"
    turn = http_turn(http, bp.rpc_url, codex("after-bad-link", "still live"))
    await page.locator('[data-session="after-bad-link"]').wait_for()
    await asyncio.wait_for(turn, 30)


async def test_a_failed_answer_can_be_given_again(
    console: Any, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """An answer that fails while the request stays pending (here the first
    session.permission gets the -32603 of a replica that did not reply): the error is
    shown and the buttons come back, so the operator answers again before it expires."""
    bp, context, _ = console
    page = await context.new_page()
    failed = await refuse_once(
        page, "session.permission", "held by replica r2, which did not answer"
    )
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/permissions")
    turn = http_turn(
        http,
        bp.rpc_url,
        agent_params("again-1", f"permission {tmp_path / 'a.txt'}", workingDirectory=str(tmp_path)),
    )
    button = page.locator('#perm-pending button[data-option="once"]')
    await button.click()
    await page.locator("#perm-pending .error").wait_for()
    assert "did not answer" in await page.locator("#perm-pending .error").inner_text()
    assert failed
    await button.click()  # enabled again
    result = (await asyncio.wait_for(turn, 30))["result"]
    assert "permission granted (once)" in result["output"]


async def test_the_live_session_list_stays_bounded(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A page left open on a busy bridge keeps the newest 500 sessions (app.js
    MAX_LISTED), not every session it ever saw; the one selected stays open."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("keep-me", "hi")), 30)
    await page.locator('[data-session="keep-me"]').click()
    await page.locator('.turn[data-status="completed"]').wait_for()
    slots = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with slots:
            await rpc(http, bp.rpc_url, "session.message", codex(f"busy-{i:03d}", "hi"))

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(520))), 120)
    await page.locator('[data-session="busy-519"]').wait_for()
    await page.wait_for_function(
        "() => document.querySelectorAll('#session-list li').length === 500", timeout=30_000
    )
    assert await page.locator('[data-session="busy-000"]').count() == 0  # the oldest went
    assert await page.locator('[data-session="keep-me"]').count() == 0  # out of the list...
    assert "keep-me" in await page.locator("#view-sessions").inner_text()  # ...still open


async def test_a_click_on_a_session_row_survives_a_render(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """A row pressed while an event re-renders the list, released after: the session
    opens. The list was rebuilt on every render, and a click whose pressed node left the
    document is never fired (on a busy bridge, a render a frame: most clicks; the flake of
    test_the_live_session_list_stays_bounded, whose click came as keep-me's turn ended)."""
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("press-1", "hi")), 30)
    box = await page.locator('[data-session="press-1"]').bounding_box()
    assert box is not None
    await page.mouse.move(box["x"] + 40, box["y"] + box["height"] / 2)
    await page.mouse.down()
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("press-2", "hi")), 30)
    await page.locator('[data-session="press-2"]').wait_for()  # rendered since the press
    # press-2 went on top: the pressed row moved down under the pointer; back on it
    box = await page.locator('[data-session="press-1"]').bounding_box()
    assert box is not None
    await page.mouse.move(box["x"] + 40, box["y"] + box["height"] / 2)
    await page.mouse.up()
    await page.locator("#d-title", has_text="press-1").wait_for(timeout=10_000)
    await page.locator('.turn[data-status="completed"]').wait_for()


async def test_resolved_permission_records_stay_bounded(console: Any) -> None:
    """A page left open keeps every pending permission request and the newest 500
    resolved ones (app.js MAX_RESOLVED, plus a margin of 100), not every decision it
    ever saw; the Permissions view shows the newest."""
    from xwm_bridge.store.records import PermissionRecord

    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    await page.goto(f"{bp.url}/console#/permissions")
    await page.locator("#perm-none").wait_for()  # the watch is open: events are recorded
    # an empty "Answered" list says so, as the empty "Pending" one does
    await page.locator("#perm-resolved-none", has_text="No request answered yet").wait_for()
    events = bp.bridge.events
    pending = PermissionRecord("s-open", "p-open", "t", "fake", {"title": "still open"})
    events.publish("permission", "requested", pending.wire(), "s-open")
    for i in range(800):
        record = PermissionRecord(
            f"s-{i}", f"r-{i}", "t", "fake", {"title": f"decision {i:03d}"}, created_at=i + 1
        ).resolved(resolution="selected", outcome="allow_once", resolved_at=i + 1)
        events.publish("permission", "resolved", record.wire(), record.session_id)
    await page.locator("#perm-resolved", has_text="decision 799").wait_for()
    await page.locator("#perm-resolved-none").wait_for(state="hidden")
    held = await page.evaluate("() => xwmConsole.held().permissions")
    assert 501 <= held <= 601, held  # the pending one and the newest resolved ones
    assert await page.locator("#perm-pending", has_text="still open").count() == 1
    assert await page.locator("#perm-resolved", has_text="decision 000").count() == 0


async def test_a_long_turns_output_and_tool_calls_stay_bounded(
    console: Any, http: aiohttp.ClientSession, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A turn streaming more than the page keeps: its newest 64 Ki characters (app.js
    MAX_OUTPUT) under "… earlier output trimmed (K characters)", live, after it ends and
    after a reload; and its newest 200 tool calls (MAX_TOOL_CALLS), with the count of the
    dropped ones."""
    from internal.peers.fake_acp import Pace

    cap = 64 * 1024
    bp, context, _ = console
    page = await context.new_page()
    await login(page, bp.url, TOKEN)
    pace = fake_upstream.state.paces["big-1"] = Pace()  # the test grants each of 3 chunks
    output = "echo: head-mark " + "x" * 150_000 + " tail-mark"
    piece = -(-len(output) // 3)
    turn = http_turn(http, bp.rpc_url, codex("big-1", output.removeprefix("echo: ")))
    await page.goto(f"{bp.url}/console#/sessions/big-1")
    await page.locator('.turn[data-status="running"]').wait_for()
    note = page.locator("[data-turn-trimmed]")
    out_len = "() => document.querySelector('pre[data-turn-output]').textContent.length"
    pace.step()
    await page.wait_for_function(f"() => ({out_len})() === {piece}")
    assert await note.is_hidden()  # under the cap: nothing trimmed
    pace.step()
    await note.wait_for()
    assert await note.inner_text() == f"… earlier output trimmed ({2 * piece - cap} characters)"
    assert await page.evaluate(out_len) == cap
    pace.step()
    await asyncio.wait_for(turn, 30)
    await page.locator('.turn[data-status="completed"]').wait_for()
    expected = f"… earlier output trimmed ({len(output) - cap} characters)"
    for reloaded in (False, True):
        if reloaded:  # the snapshot (session.get, session.replay) is trimmed the same way
            await page.reload()
            await page.locator('.turn[data-status="completed"]').wait_for()
        await page.locator("[data-turn-trimmed]", has_text=expected).wait_for()
        text = await page.locator("pre[data-turn-output]").inner_text()
        assert len(text) == cap and text.endswith(" tail-mark"), len(text)
        assert await page.evaluate("() => xwmConsole.held().output") == cap
        # with the stored result (its first 64 KiB: truncated) the page holds ~2 caps
        assert await page.evaluate("document.body.textContent.length") < 2 * cap + 10_000

    # a result stored whole (under 256 KiB) whose output is over the cap: trimmed the same way
    mid = "echo: " + "y" * 70_000 + " mid-tail"
    await asyncio.wait_for(http_turn(http, bp.rpc_url, codex("mid-1", mid[6:])), 30)
    await page.goto(f"{bp.url}/console#/sessions/mid-1")
    expected = f"… earlier output trimmed ({len(mid) - cap} characters)"
    await page.locator("[data-turn-trimmed]", has_text=expected).wait_for()
    assert len(await page.locator("pre[data-turn-output]").inner_text()) == cap
    shown = await page.locator("#turns pre.json").text_content() or ""
    assert len(shown) < cap + 100 and shown.endswith(" more characters)")

    params = agent_params("tools-1", "tools 250", workingDirectory=str(tmp_path))
    await asyncio.wait_for(http_turn(http, bp.rpc_url, params), 60)
    await page.goto(f"{bp.url}/console#/sessions/tools-1")
    await page.locator('.turn[data-status="completed"]').wait_for()
    items = page.locator(".turn .items .item")
    await page.locator(".turn .items", has_text="… 50 earlier tool calls not shown").wait_for()
    assert await items.count() == 200 + 1  # the newest 200 and the dropped-count line
    assert await items.filter(has_text="step 50 (read)").count() == 0
    assert await items.filter(has_text="step 51 (read)").count() == 1
    assert await items.filter(has_text="step 250 (read)").count() == 1
    assert await page.evaluate("() => xwmConsole.held().toolCalls") == 200
