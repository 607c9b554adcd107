"""Screenshots of every console view for the docs (``make console-screenshots``).

Starts the real daemon (a subprocess on a free loopback port) with the fake
upstream and the scripted ACP agent, runs a few turns (done, failed, one
streaming, one waiting for a permission), and has Debian's chromium (through
Playwright) photograph each view into ``docs/architecture/console/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import ClientSession, web

from internal.peers.fake_acp import create_app

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "architecture" / "console"
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
AGENT = [sys.executable, "-m", "internal.peers.fake_acp_agent"]


async def start_daemon(tmp: Path, upstream: str, token: str) -> tuple[Any, int]:
    config = {
        "providers": [
            {"id": "codex", "label": "Codex", "endpoint": f"{upstream}/acp/rpc"},
            {"id": "fake", "label": "Fake Agent", "kind": "stdio", "command": AGENT},
        ],
        "allowed_roots": [str(tmp)],
        "agents": {"permission_timeout": 600},
        "console": {"health_interval": 0.5},
    }
    path = tmp / "bridge.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACP_", "XWM_", "INTERNAL_"))}
    env.update(ACP_AUTH_TOKEN=token, XWM_STATE_DIR=str(tmp / "state"), PYTHONPATH=str(ROOT))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "xwm_bridge", "serve", "--listen", "127.0.0.1:0",
        "--config", str(path), env=env, cwd=str(ROOT),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    while True:
        line = await asyncio.wait_for(proc.stderr.readline(), 30)
        if not line:
            raise RuntimeError("daemon exited before listening")
        with contextlib.suppress(orjson.JSONDecodeError):
            entry = orjson.loads(line)
            if isinstance(entry, dict) and entry.get("msg") == "listening":
                return proc, int(entry["port"])


async def rpc(http: ClientSession, url: str, token: str, method: str, params: Any) -> Any:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    async with http.post(url, data=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return orjson.loads(await r.read())


def routed(session_id: str, prompt: str, provider: str, **extra: Any) -> dict[str, Any]:
    routing = {
        "routingMode": "explicit",
        "explicitExecutionTarget": "singleAgent",
        "explicitProviderId": provider,
    }
    return {"sessionId": session_id, "taskPrompt": prompt, "routing": routing, **extra}


async def main() -> None:
    from playwright.async_api import async_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="xwm-shots-") as tmpdir:
        tmp = Path(tmpdir)
        runner = web.AppRunner(create_app(latency_ms=0, chunks=4))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        upstream_port = runner.addresses[0][1]
        proc, port = await start_daemon(tmp, f"http://127.0.0.1:{upstream_port}", token)
        base = f"http://127.0.0.1:{port}"
        url = f"{base}/acp/rpc"
        try:
            async with ClientSession() as http, async_playwright() as pw:

                async def start(sid: str, prompt: str, provider: str, **extra: Any) -> Any:
                    return await rpc(
                        http, url, token, "session.start", routed(sid, prompt, provider, **extra)
                    )

                wd = {"workingDirectory": str(tmp)}
                await start("review-auth-module", "review the auth module", "codex", threadId="web")
                await start("fix-flaky-test", "error", "codex", threadId="ci")
                await start("summarize-changelog", "summarize the changelog", "fake", **wd)
                ask = f"permission {tmp / 'config.yaml'}"
                background = [
                    asyncio.ensure_future(
                        start("refactor-config", ask, "fake", threadId="refactor", **wd)
                    )
                ]
                browser = await pw.chromium.launch(
                    executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
                )
                page = await browser.new_page(viewport={"width": 1360, "height": 820})
                await page.goto(f"{base}/console")
                await page.locator("#login").wait_for(state="visible")
                await page.screenshot(path=str(OUT / "login.png"))
                await page.locator("#token").fill(token)
                await page.locator("#login-submit").click()
                await page.locator("#conn.live").wait_for()
                background.append(
                    asyncio.ensure_future(
                        start("write-release-notes", "drip 40 300", "fake", threadId="docs", **wd)
                    )
                )
                await page.goto(f"{base}/console#/sessions/write-release-notes")
                await page.wait_for_function(
                    "() => (document.querySelector('pre[data-turn-output]') || {})"
                    ".textContent?.includes('chunk 6')"
                )
                await page.screenshot(path=str(OUT / "sessions.png"))
                await page.goto(f"{base}/console#/permissions")
                await page.locator("#perm-pending .perm").first.wait_for()
                await page.screenshot(path=str(OUT / "permissions.png"))
                await page.goto(f"{base}/console#/health")
                await asyncio.sleep(4)  # a few samples for the charts
                await page.screenshot(path=str(OUT / "health.png"))
                await page.goto(f"{base}/console#/config")
                await page.locator("#config-json").wait_for()
                await asyncio.sleep(0.3)
                await page.screenshot(path=str(OUT / "config.png"))
                await browser.close()
                for fut in background:
                    fut.cancel()
        finally:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)
            if proc.returncode is None:
                proc.kill()
            await runner.cleanup()
    print(f"screenshots written to {OUT.relative_to(ROOT)}/")


if __name__ == "__main__":
    asyncio.run(main())
