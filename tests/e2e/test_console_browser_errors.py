"""The operator console in a real browser: the page's own requests that fail (a resync
after a reset, a filter change) are shown in its error banner and retried, never left
as unhandled promise rejections; resyncs run one at a time; after a reset the page
watches on from the reset's cursor and reads the config again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge, rpc, wait_until
from tests.e2e.console_browser import Watch, codex, login, open_console

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RESET = {"kind": "watch", "type": "live", "reset": True}  # as after a too-old cursor


@pytest.fixture
async def console(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any, Watch]]:
    async with open_console(start_bridge, fake_upstream, tmp_path) as opened:
        yield opened


@dataclass
class Relay:
    """The page's console WebSocket through the test: once armed, the next ``fail``
    session.list requests get -32603 in the bridge's place, or (``hold``) the first
    answer is kept until released; counts the session.list requests in flight."""

    fail: int = 0
    hold: bool = False
    sockets: list[Any] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)  # session.list ids sent to the bridge
    in_flight: int = 0
    most: int = 0
    held: list[str] = field(default_factory=list)
    drop_events: bool = False  # the bridge's bridge.event notifications do not reach the page
    dropped: int = 0
    watches: list[dict[str, Any]] = field(default_factory=list)  # bridge.watch params sent
    config_marker: str = ""  # put in the config of each bridge.config answer from now on
    config_ids: list[Any] = field(default_factory=list)
    configs: int = 0  # bridge.config requests sent
    swallow: int = 0  # the next session.list requests never reach the bridge
    swallowed: list[dict[str, Any]] = field(default_factory=list)  # their params

    def __call__(self, ws: Any) -> None:
        server = ws.connect_to_server()
        self.sockets.append(ws)

        def from_page(frame: str | bytes) -> None:
            msg = json.loads(frame)
            if msg.get("method") == "bridge.watch":
                self.watches.append(msg.get("params") or {})
            if msg.get("method") == "bridge.config":
                self.configs += 1
                self.config_ids.append(msg["id"])
            if msg.get("method") == "session.list":
                if self.swallow:  # the test drops the connection while it waits
                    self.swallow -= 1
                    self.swallowed.append(msg.get("params") or {})
                    return
                if self.fail:
                    self.fail -= 1
                    err = {"code": -32603, "message": "session store unavailable"}
                    ws.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": err}))
                    return
                self.asked.append(msg["id"])
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            server.send(frame)

        def from_server(frame: str | bytes) -> None:
            msg = json.loads(frame)
            if msg.get("method") == "bridge.event" and self.drop_events:
                self.dropped += 1
                return
            if msg.get("id") in self.asked:
                if self.hold and not self.held:
                    self.held.append(str(frame))
                    return
                self.in_flight -= 1
            if msg.get("id") in self.config_ids and self.config_marker and "result" in msg:
                msg["result"]["config"]["marker"] = self.config_marker
                frame = json.dumps(msg)
            ws.send(frame)

        ws.on_message(from_page)
        server.on_message(from_server)

    def reset(self, cursor: str | None = None) -> None:
        params = {**RESET, "cursor": cursor} if cursor else RESET
        note = {"jsonrpc": "2.0", "method": "bridge.event", "params": params}
        self.sockets[-1].send(json.dumps(note))

    def release(self) -> None:
        self.hold = False
        self.in_flight -= 1
        self.sockets[-1].send(self.held[0])


async def test_a_failed_resync_is_shown_and_retried(console: Any) -> None:
    bp, context, watch = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    relay.fail = 1
    relay.reset()
    banner = page.locator("#console-error")
    await banner.wait_for(state="visible", timeout=10_000)
    text = await banner.inner_text()
    assert "could not re-read" in text and "session store unavailable" in text, text
    assert watch.errors == [], watch.errors  # no unhandled rejection
    await banner.wait_for(state="hidden", timeout=15_000)  # retried, and it worked
    assert relay.fail == 0


async def test_resets_in_a_row_resync_one_at_a_time(console: Any) -> None:
    bp, context, _ = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    before = len(relay.asked)
    relay.hold = True
    relay.reset()
    await wait_until(lambda: bool(relay.held), within=10)  # the first resync waits
    for _ in range(3):
        relay.reset()
    other = {"sessionId": "rs-mark", "requestId": "rs-mark", "state": "pending", "createdAt": 1}
    bp.bridge.events.publish("permission", "requested", other, "rs-mark")
    await page.locator("#perm-badge", has_text="1").wait_for()  # the resets were handled
    assert len(relay.asked) == before + 1 and relay.most == 1  # none overlapped the first
    relay.release()
    await wait_until(lambda: len(relay.asked) == before + 2, within=10)  # one more, coalesced
    await wait_until(lambda: relay.in_flight == 0, within=10)
    assert relay.most == 1


async def test_a_failed_filter_change_is_shown(console: Any) -> None:
    bp, context, watch = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    relay.fail = 1
    await page.locator("#f-since").select_option("3600")
    banner = page.locator("#console-error")
    await banner.wait_for(state="visible", timeout=10_000)
    assert "could not list the sessions" in await banner.inner_text()
    assert watch.errors == [], watch.errors
    await page.locator("#f-since").select_option("86400")  # this one works: the error goes
    await banner.wait_for(state="hidden", timeout=10_000)


async def test_after_a_reset_the_page_watches_from_the_resets_cursor(console: Any) -> None:
    """A reset's live event carries the cursor to watch on from; the page kept its old
    one (too old, or of another process) until some later event came, and a connection
    dropped meanwhile re-watched from it: another reset, another full resync."""
    bp, context, _ = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    relay.drop_events = True  # the page's cursor stays where it is
    await wait_until(lambda: relay.dropped > 0, within=10)  # a metrics sample went by
    fresh = bp.bridge.events.cursor
    before = len(relay.asked)
    relay.reset(fresh)
    await wait_until(lambda: len(relay.asked) > before, within=10)  # it resyncs
    await wait_until(lambda: relay.in_flight == 0, within=10)
    watched = len(relay.watches)
    await relay.sockets[-1].close()  # the connection drops before any other event arrives
    await wait_until(lambda: len(relay.watches) > watched, within=15)  # reconnected
    assert relay.watches[-1].get("since") == fresh, relay.watches


async def test_a_reset_reads_the_config_again(console: Any, tmp_path: Path) -> None:
    """A reset is most often a bridge that restarted, maybe with another config: the
    Config view showed the old process's (read once, when first opened) until the page
    was reloaded. The relay marks the bridge.config answers as another process's."""
    bp, context, _ = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    shown = page.locator("#config-json")
    await page.locator("#tabs a[data-view=config]").click()
    await shown.filter(has_text='"listen"').wait_for()
    assert relay.configs == 1
    relay.config_marker = "restarted-with-another-config"
    relay.reset()
    await shown.filter(has_text="restarted-with-another-config").wait_for(timeout=10_000)
    # a reset while another view is shown: read again when the Config view is next opened
    await page.locator("#tabs a[data-view=sessions]").click()
    relay.config_marker = "and-again"
    before = len(relay.asked)
    relay.reset()
    await wait_until(lambda: len(relay.asked) > before, within=10)  # it resynced
    await wait_until(lambda: relay.in_flight == 0, within=10)
    await page.locator("#tabs a[data-view=config]").click()
    await shown.filter(has_text="and-again").wait_for(timeout=10_000)
    await page.screenshot(path=str(tmp_path / "config-after-reset.png"))  # looked at
    assert relay.configs == 3


async def test_a_drop_during_the_first_load_reconnects_and_loads(
    console: Any, http: aiohttp.ClientSession
) -> None:
    """The connection dropped while the page read its first snapshots: it went to the
    login screen ("The console could not load: connection closed") and forgot the
    token, where any later drop reconnects. Now it reconnects and loads."""
    bp, context, watch = console
    done = await rpc(http, bp.rpc_url, "session.start", codex("fl-one", "hello"))
    assert done["result"]["success"] is True, done
    page = await context.new_page()
    relay = Relay(swallow=1)
    await page.route_web_socket("**/console/ws", relay)
    await page.goto(f"{bp.url}/console")
    await page.locator("#token").fill(TOKEN)
    await page.locator("#login-submit").click()
    await wait_until(lambda: bool(relay.swallowed), within=10)
    await relay.sockets[-1].close()
    await wait_until(lambda: len(relay.sockets) > 1, within=15)  # reconnected
    await page.locator("#conn.live").wait_for(timeout=15_000)
    await page.locator('[data-session="fl-one"]').wait_for(timeout=10_000)
    assert await page.locator("#login").is_hidden()
    assert watch.errors == [], watch.errors


async def test_a_filter_change_lost_to_a_drop_is_read_again_after_the_reconnect(
    console: Any,
) -> None:
    """A filter change whose list read was lost with the connection kept the old
    filter's list (and its error) after the page reconnected."""
    bp, context, _ = console
    page = await context.new_page()
    relay = Relay()
    await page.route_web_socket("**/console/ws", relay)
    await login(page, bp.url, TOKEN)
    relay.swallow = 1
    await page.locator("#f-since").select_option("3600")
    await wait_until(lambda: bool(relay.swallowed), within=10)
    asked = len(relay.asked)
    await relay.sockets[-1].close()
    await wait_until(lambda: len(relay.asked) > asked, within=15)  # read again
    await wait_until(lambda: relay.in_flight == 0, within=10)
    banner = page.locator("#console-error")
    await banner.wait_for(state="hidden", timeout=10_000)
