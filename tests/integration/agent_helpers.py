"""Helpers for the stdio-agent suites: streaming SSE reader and config builders."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from tests.conftest import AUTH, EXPLICIT, ROOT, BridgeProcess, _drain_stderr

FAKE_AGENT = [sys.executable, "-m", "internal.peers.fake_acp_agent"]


def agent_provider(
    pid: str = "fake", command: list[str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "id": pid,
        "label": "Fake Agent",
        "kind": "stdio",
        "command": command or FAKE_AGENT,
        **extra,
    }


def agent_params(
    session_id: str, prompt: str, provider: str = "fake", **extra: Any
) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "taskPrompt": prompt,
        "routing": {**EXPLICIT, "explicitProviderId": provider},
        **extra,
    }


async def sse_stream(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any],
    rid: Any = 1,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Yield each SSE event as it arrives (the final result event last)."""
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    hdrs = {**(headers or AUTH), "Accept": "text/event-stream"}
    async with http.post(url, data=orjson.dumps(body), headers=hdrs) as resp:
        assert resp.status == 200, await resp.text()
        buf = b""
        async for data in resp.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                if block.startswith(b"data: ") and block[6:] != b"[DONE]":
                    yield orjson.loads(block[6:])


def deltas(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["params"].get("delta", "")
        for e in events
        if e.get("method") == "session.update" and e["params"].get("type") == "delta"
    )


def typed(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        e["params"]
        for e in events
        if e.get("method") == "session.update" and e["params"].get("type") == kind
    ]


async def start_adapter(
    argv: list[str], env: dict[str, str], config: dict[str, Any] | None, tmp: Path
) -> BridgeProcess:
    """Spawn ``xwm-bridge agent-adapter`` on an ephemeral port; the caller stops it."""
    cmd = [sys.executable, "-m", "xwm_bridge", *argv, "--listen", "127.0.0.1:0"]
    if config is not None:
        path = tmp / "adapter.yaml"
        path.write_text(yaml.safe_dump(config))
        cmd += ["--config", str(path)]
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    bp = BridgeProcess(proc)
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    bp._drain = asyncio.get_running_loop().create_task(_drain_stderr(bp, ready))
    try:
        bp.port = await asyncio.wait_for(ready, 20)
    except BaseException:
        await bp.stop(signal.SIGKILL, wait_s=5)
        raise
    return bp
