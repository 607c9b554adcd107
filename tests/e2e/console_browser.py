"""Shared pieces of the console's browser tests and screenshots: Debian's chromium
driven by Playwright (no browser download), and a daemon with the fake upstream
and the scripted ACP agent."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import TOKEN, FakeUpstream, StartBridge, base_env, rpc
from tests.integration.agent_helpers import FAKE_AGENT, agent_params

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_browser() -> None:
    """Skip with a reason locally; fail in CI (CI=true), where .ci/run installs both."""
    missing = []
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("playwright (pip install -e '.[dev]')")
    if not os.path.exists(CHROMIUM) and shutil.which("chromium") is None:
        missing.append("chromium (apt-get install chromium)")
    if missing:
        reason = "console browser tests need " + " and ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def console_config(tmp: Path, **agents: Any) -> dict[str, Any]:
    return {
        "providers": [
            {"id": "codex", "label": "Codex", "endpoint": "http://127.0.0.1:1/acp/rpc"},
            {"id": "fake", "label": "Fake Agent", "kind": "stdio", "command": FAKE_AGENT},
        ],
        "allowed_roots": [str(tmp)],
        "agents": {"initialize_timeout": 20, **agents},
        "console": {"health_interval": 0.5},
    }


@dataclass
class Watch:
    """What the pages did: console errors and every request's host."""

    origin: str
    errors: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> None:
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("request", self._request)

    def _console(self, msg: Any) -> None:
        if msg.type in ("error", "warning"):
            self.errors.append(f"{msg.type}: {msg.text}")

    def _request(self, request: Any) -> None:
        url = request.url
        if url.startswith(("data:", "about:")):
            return
        parts = urlsplit(url)
        if f"{parts.hostname}:{parts.port}" != urlsplit(self.origin).netloc:
            self.foreign.append(url)


@asynccontextmanager
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


async def login(page: Any, url: str, token: str) -> None:
    await page.goto(f"{url}/console")
    await page.locator("#token").fill(token)
    await page.locator("#login-submit").click()
    await page.locator("#main").wait_for(state="visible")
    await page.locator("#conn.live").wait_for()


@asynccontextmanager
async def open_console(
    start_bridge: StartBridge, fake_upstream: FakeUpstream, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any, Watch]]:
    """The daemon (token, fake upstream, scripted agent) and a browser context on it;
    when it ends: no console error, no request to any host but the daemon."""
    require_browser()
    env = base_env(ACP_AUTH_TOKEN=TOKEN, XWM_PROVIDER_CODEX_URL=fake_upstream.url)
    bp = await start_bridge(env=env, config=console_config(tmp_path), tmp=tmp_path)
    watch = Watch(bp.url)
    async with browser() as b:
        context = await b.new_context(viewport={"width": 1360, "height": 860})
        context.on("page", watch.attach)
        yield bp, context, watch
        await context.close()
    assert watch.errors == [], watch.errors
    assert watch.foreign == [], watch.foreign


#: the turns a test started over HTTP; awaited (or cancelled) when it ends
_turns: list[asyncio.Future[Any]] = []


def http_turn(http: Any, url: str, params: dict[str, Any]) -> asyncio.Future[Any]:
    turn = asyncio.ensure_future(rpc(http, url, "session.start", params))
    _turns.append(turn)
    return turn


async def settle_turns() -> None:
    """A test that fails before awaiting its turn leaves no task behind (its exception,
    never retrieved, would be logged by the garbage collector; see tests/ast_guard.py)."""
    for turn in _turns:
        turn.cancel()
    await asyncio.gather(*_turns, return_exceptions=True)
    _turns.clear()


def codex(session_id: str, prompt: str) -> dict[str, Any]:
    return agent_params(session_id, prompt, provider="codex")


async def refuse_once(page: Any, method: str, message: str) -> list[Any]:
    """Route the page's console WebSocket through a relay that answers the page's first
    ``method`` request with ``-32603 message`` in the bridge's place (every other frame
    passes); the list gets that request's id."""
    refused: list[Any] = []

    def relay(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_page(frame: str | bytes) -> None:
            msg = json.loads(frame)
            if msg.get("method") == method and not refused:
                refused.append(msg["id"])
                err = {"code": -32603, "message": message}
                ws.send(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": err}))
                return
            server.send(frame)

        ws.on_message(from_page)

    await page.route_web_socket("**/console/ws", relay)
    return refused
