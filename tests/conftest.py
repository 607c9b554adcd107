"""Shared fixtures: the real daemon as a subprocess on an ephemeral loopback port,
and the in-repo fake upstream ACP provider in-process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import settings

from internal.peers.fake_acp import STATE_KEY, FakeState, create_app
from tests import ast_guard

ast_guard.install()  # failure reports on CPython < 3.11.8 (see the module)

# No per-example deadline: a property test checks what a function returns, not how fast
# (performance is measured by internal/bench, never asserted); on 2 shared cores one
# example can take over hypothesis's default 200 ms, and the test failed as "flaky".
settings.register_profile("xwm", deadline=None)
settings.load_profile("xwm")

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXPLICIT = {"routingMode": "explicit", "explicitExecutionTarget": "singleAgent"}


#: every daemon gets its own session-store directory unless the test passes one
#: (restart tests pass the same XWM_STATE_DIR to both processes)
_STATE_ROOT = tempfile.TemporaryDirectory(prefix="xwm-test-state-")


def fresh_state_dir() -> str:
    return tempfile.mkdtemp(dir=_STATE_ROOT.name)


def base_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACP_", "XWM_", "INTERNAL_SERVICE", "BRIDGE_", "IMAGE", "LLM_"))
        # a proxy of the machine running the suite would take the daemons' loopback
        # upstream calls (loopback is not exempt: operations.md); a test sets its own
        and k.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env["XWM_STATE_DIR"] = fresh_state_dir()
    # agents on this machine's PATH must not become providers of every test daemon
    env["XWM_AGENTS_DETECT"] = "false"
    env.update(extra)
    return env


@dataclass
class FakeUpstream:
    server: TestServer

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}/acp"

    @property
    def state(self) -> FakeState:
        return self.server.app[STATE_KEY]  # type: ignore[index]

    def release(self) -> None:
        """Let every held turn go (a failed test must not leave one blocking teardown)."""
        for hold in (*self.state.holds.values(), *self.state.cancel_holds.values()):
            hold.set()
        for pace in self.state.paces.values():
            pace.open()


#: how long a fake upstream's close waits for the handlers still running (a slow turn
#: whose bridge side was cancelled) before it cancels them: aiohttp's default is 60 s,
#: and each test that ended with one in flight waited for the handler's whole sleep
UPSTREAM_SHUTDOWN = 0.25


@pytest.fixture
async def fake_upstream() -> AsyncIterator[FakeUpstream]:
    server = TestServer(create_app(latency_ms=0, chunks=3), host="127.0.0.1", port=0)
    await server.start_server(shutdown_timeout=UPSTREAM_SHUTDOWN)
    fake = FakeUpstream(server)
    try:
        yield fake
    finally:
        fake.release()
        await server.close()


@dataclass
class BridgeProcess:
    proc: asyncio.subprocess.Process
    port: int = 0
    logs: list[str] = field(default_factory=list)
    _drain: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def rpc_url(self) -> str:
        return f"{self.url}/acp/rpc"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/acp"

    async def stop(self, sig: int = signal.SIGTERM, wait_s: float = 30) -> int:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), wait_s)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain, 5)
        assert self.proc.returncode is not None
        return self.proc.returncode


async def _drain_stderr(bp: BridgeProcess, ready: asyncio.Future[int]) -> None:
    assert bp.proc.stderr is not None
    while True:
        line = await bp.proc.stderr.readline()
        if not line:
            break
        text = line.decode(errors="replace").rstrip("\n")
        bp.logs.append(text)
        if not ready.done():
            with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                entry = orjson.loads(text)
                if isinstance(entry, dict) and entry.get("msg") == "listening":
                    ready.set_result(int(entry["port"]))
    if not ready.done():
        ready.set_exception(RuntimeError("bridge exited before listening:\n" + "\n".join(bp.logs)))


StartBridge = Callable[..., Awaitable[Any]]


async def _spawn_bridge(
    args: tuple[str, ...],
    env: dict[str, str] | None,
    config: dict[str, Any] | None,
    tmp: Path | None,
    started: list[BridgeProcess],
) -> BridgeProcess:
    argv = [sys.executable, "-m", "xwm_bridge", "serve", "--listen", "127.0.0.1:0", *args]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        cwd=str(ROOT),
    )
    bp = BridgeProcess(proc)
    started.append(bp)
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    bp._drain = asyncio.get_running_loop().create_task(_drain_stderr(bp, ready))
    bp.port = await asyncio.wait_for(ready, 20)
    return bp


def _config_args(config: dict[str, Any] | None, tmp: Path | None, n: int) -> tuple[str, ...]:
    if config is None:
        return ()
    assert tmp is not None, "pass tmp= with config="
    import yaml

    path = tmp / f"bridge-{n}.yaml"
    path.write_text(yaml.safe_dump(config))
    return ("--config", str(path))


@pytest.fixture
async def start_bridge_process() -> AsyncIterator[StartBridge]:
    """The daemon as a separate process: for signals, ``kill -9``, exit codes and
    anything else that needs a process of its own."""
    started: list[BridgeProcess] = []

    async def start(
        *args: str,
        env: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        tmp: Path | None = None,
    ) -> BridgeProcess:
        argv = (*args, *_config_args(config, tmp, len(started)))
        env = env if env is not None else base_env(ACP_AUTH_TOKEN=TOKEN)
        return await _spawn_bridge(argv, env, config, tmp, started)

    yield start
    for bp in started:
        await bp.stop(signal.SIGKILL if bp.proc.returncode is None else signal.SIGTERM, wait_s=10)


@pytest.fixture
async def start_bridge() -> AsyncIterator[StartBridge]:
    """The daemon in this process (tests/inprocess.py), on an ephemeral loopback port;
    same arguments and the same ``url``/``rpc_url``/``ws_url``/``logs``/``stop()``
    as :func:`start_bridge_process`, which it falls back to for arguments only a
    process understands."""
    from tests.inprocess import InProcessBridge, NeedsProcess, start_in_process

    started: list[InProcessBridge] = []
    spawned: list[BridgeProcess] = []

    async def start(
        *args: str,
        env: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        tmp: Path | None = None,
    ) -> Any:
        argv = (*args, *_config_args(config, tmp, len(started) + len(spawned)))
        env = env if env is not None else base_env(ACP_AUTH_TOKEN=TOKEN)
        try:
            bridge = await start_in_process(argv, env)
        except NeedsProcess:
            return await _spawn_bridge(argv, env, config, tmp, spawned)
        started.append(bridge)
        return bridge

    yield start
    for bridge in reversed(started):
        await bridge.stop()
    for bp in spawned:
        await bp.stop(signal.SIGKILL if bp.proc.returncode is None else signal.SIGTERM, wait_s=10)


def provider_env(upstream_url: str, **extra: str) -> dict[str, str]:
    """Bridge env whose whole catalog points at one fake upstream."""
    return base_env(
        ACP_AUTH_TOKEN=TOKEN,
        XWM_PROVIDER_CODEX_URL=upstream_url,
        XWM_PROVIDER_OPENCODE_URL=upstream_url,
        XWM_PROVIDER_GEMINI_URL=upstream_url,
        **extra,
    )


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def rpc(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any] | None = None,
    rid: Any = 1,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        body["params"] = params
    async with http.post(url, data=orjson.dumps(body), headers=headers or AUTH) as resp:
        assert resp.status == 200, await resp.text()
        result: dict[str, Any] = orjson.loads(await resp.read())
        return result


async def sse(
    http: aiohttp.ClientSession,
    url: str,
    method: str,
    params: dict[str, Any],
    rid: Any = 1,
) -> list[Any]:
    """POST with Accept: text/event-stream; return decoded events ('[DONE]' kept as a string)."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if rid is not None:
        body["id"] = rid
    headers = {**AUTH, "Accept": "text/event-stream"}
    async with http.post(url, data=orjson.dumps(body), headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = (await resp.read()).decode()
    events: list[Any] = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append("[DONE]" if data == "[DONE]" else orjson.loads(data))
    return events


def session_params(session_id: str, prompt: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "sessionId": session_id,
        "taskPrompt": prompt,
        "routing": {**EXPLICIT, "explicitProviderId": "codex"},
        **extra,
    }


# --- helpers for the turn / queue / cancel / upstream / artifact suites -------------------

MakeUpstream = Callable[..., Awaitable[FakeUpstream]]


@pytest.fixture
async def make_fake_upstream() -> AsyncIterator[MakeUpstream]:
    """Factory for extra in-process fake upstreams (each on its own port)."""
    servers: list[TestServer] = []

    async def make(latency_ms: float = 0, chunks: int = 3) -> FakeUpstream:
        server = TestServer(
            create_app(latency_ms=latency_ms, chunks=chunks), host="127.0.0.1", port=0
        )
        await server.start_server(shutdown_timeout=UPSTREAM_SHUTDOWN)
        servers.append(server)
        return FakeUpstream(server)

    yield make
    for server in servers:
        FakeUpstream(server).release()
        await server.close()


ServeApp = Callable[[Any], Awaitable[str]]


@pytest.fixture
async def serve_app() -> AsyncIterator[ServeApp]:
    """Serve an arbitrary aiohttp ``web.Application`` on loopback; returns its base URL."""
    servers: list[TestServer] = []

    async def serve(app: Any) -> str:
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield serve
    for server in servers:
        await server.close()


def closed_port() -> int:
    """A loopback port with nothing listening on it (connection refused)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def wait_until(
    predicate: Callable[[], bool], within: float = 5.0, interval: float = 0.01
) -> None:
    """Poll ``predicate`` until true; fail the test after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(interval)


T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], within: float = 10.0, interval: float = 0.02
) -> T:
    """Await ``probe()`` until it returns something truthy (a reply read over the wire,
    say) and return that; fail the test after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = await probe()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s (last: {got!r})")
        await asyncio.sleep(interval)


async def read_metric(http: aiohttp.ClientSession, base_url: str, name: str) -> float:
    """The value of an unlabelled sample ``name`` on the daemon's ``/metrics``."""
    async with http.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith(f"{name} "))
    return float(line.split()[1])


def log_entries(lines: list[str]) -> list[dict[str, Any]]:
    """The daemon's JSON log lines, decoded (other lines skipped)."""
    return [orjson.loads(x) for x in lines if x.startswith("{")]


def providers_config(*providers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A YAML-config dict with the given provider entries (and any other top-level keys)."""
    return {"providers": list(providers), **extra}


def updates(events: list[Any]) -> list[dict[str, Any]]:
    """The ``params`` of every bridge-generated ``session.update`` (those with ``threadId``)."""
    return [
        e["params"]
        for e in events
        if isinstance(e, dict)
        and e.get("method") == "session.update"
        and "threadId" in e.get("params", {})
    ]


Reply = Callable[[dict[str, Any]], Any]


def scripted_app(reply: Reply, seen: list[dict[str, Any]]) -> Any:
    """A one-handler upstream: every POST is recorded in ``seen`` (path, headers, body)
    and answered by ``reply(body)``: a dict is sent as JSON, bytes as a text/plain body,
    a ``web.StreamResponse`` as is; an awaitable result is awaited first."""
    import inspect

    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        seen.append({"path": request.path, "headers": dict(request.headers), "body": body})
        out = reply(body)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, web.StreamResponse):
            return out
        if isinstance(out, bytes):
            return web.Response(body=out, content_type="text/plain")
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    return app


async def wait_queue_depth(
    http: aiohttp.ClientSession, base_url: str, depth: int, metric: str = "xwm_queue_depth"
) -> None:
    """Wait until ``depth`` turns wait in thread queues (read from ``/metrics``), so the
    next submission's FIFO position is known regardless of scheduling. ``metric``: another
    gauge to wait for (``xwm_threads_alive``: a thread's first turn has arrived)."""

    async def deep_enough() -> bool:
        return await read_metric(http, base_url, metric) >= depth

    await eventually(deep_enough)


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]] | None:
    """Tests run on uvloop when it is installed, as the daemon does (cli/common.py _run);
    a test marked :data:`tests.markers.both_loops` also on asyncio's default loop (the
    daemon's without the ``[fast]`` extra), where subprocesses behave differently."""
    marker = item.get_closest_marker("asyncio")
    chosen = marker.kwargs.get("loop_factories") if marker is not None else None
    factories: dict[str, Callable[[], Any]] = {}
    try:
        import uvloop
    except ImportError:
        pass
    else:
        factories["uvloop"] = uvloop.new_event_loop
    if chosen or not factories:
        factories["asyncio"] = asyncio.new_event_loop
    return factories
