"""How the HTTP test peers run as a process (``python -m internal.peers.fake_acp``,
``fake_llm``): serve the app, print the line tests wait for, run until stopped."""

from __future__ import annotations

import asyncio

from aiohttp import web


async def serve_forever(app: web.Application, host: str, port: int) -> None:
    """Serve ``app`` on ``host:port`` (0: a free port), print ``listening HOST:PORT``
    once it accepts, and run until cancelled."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening {host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
