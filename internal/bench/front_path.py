"""CPU per request of the ``POST /acp/rpc`` front path, in process (issue 11).

    .venv/bin/python -m internal.bench.front_path                  # acp.capabilities
    .venv/bin/python -m internal.bench.front_path --upstream URL   # session.message turns

The daemon's own objects (config from an environment, ``Bridge``, ``HttpTransport``,
``Dispatcher``, the ``transport.serving.Server`` and its front), but no socket to the
client: keep-alive requests are fed to ``FrontProtocol.data_received`` as the bytes
the benchmark's raw client sends (``Host``, ``Content-Type``, ``Accept``,
``Authorization``, ``Content-Length``), and the answer is taken from a fake transport's
``write``. The audit line is rendered and queued as in the daemon (the sink's writer
discards it). With ``--upstream`` (a fake upstream the caller started, e.g. ``python -m
internal.peers.fake_acp --port P``), the requests are ``session.message`` turns to it,
one session per connection; the upstream calls use real sockets.

Reported, per request: CPU of the thread that runs the event loop (``thread_us``: the
front, the method, the audit line; not the store's or the log writer's threads),
of the whole process (``process_us``) and, with ``--calls``, Python-level calls under
cProfile. Only same-run comparisons mean anything on a shared machine: run two
checkouts alternately (``PYTHONPATH=<checkout>``) and compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from typing import Any

import orjson

from xwm_bridge.app.bridge import Bridge
from xwm_bridge.app.dispatcher import Dispatcher
from xwm_bridge.app.methods import BridgeMethods
from xwm_bridge.config import load_config
from xwm_bridge.observability.logging import setup_logging
from xwm_bridge.transport.front import FrontProtocol
from xwm_bridge.transport.http import HttpTransport
from xwm_bridge.transport.serving import Server

TOKEN = "front-path-bench-token-0123456789"
ROUTING = {
    "routingMode": "explicit",
    "explicitExecutionTarget": "singleAgent",
    "explicitProviderId": "codex",
}


class SinkTransport(asyncio.Transport):
    """Takes the answers: each ``write`` completes the waiting request's future."""

    def __init__(self) -> None:
        super().__init__()
        self.waiter: asyncio.Future[bytes] | None = None
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def request_bytes(body: bytes) -> bytes:
    """A request as ``internal.bench.clients.RawHttpClient`` sends it."""
    lines = [
        "POST /acp/rpc HTTP/1.1",
        "Host: 127.0.0.1:8787",
        "Content-Type: application/json",
        "Accept: application/json",
        f"Authorization: Bearer {TOKEN}",
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def bodies(conns: int, turns: bool) -> list[bytes]:
    if not turns:
        caps = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "acp.capabilities"})
        return [request_bytes(caps)] * conns
    out = []
    for i in range(conns):
        params = {"sessionId": f"s{i}", "taskPrompt": "hello there", "routing": ROUTING}
        frame = {"jsonrpc": "2.0", "id": 1, "method": "session.message", "params": params}
        out.append(request_bytes(orjson.dumps(frame)))
    return out


async def measure(
    n: int, *, conns: int = 1, upstream: str = "", calls: bool = False
) -> dict[str, Any]:
    """``n`` requests over ``conns`` connections after a warm-up; per-request figures.
    Sets up the process's logging (``setup_logging``), as the daemon does."""
    with tempfile.TemporaryDirectory(prefix="xwm-front-path-") as state:
        return await _measure(n, conns, upstream, calls, state)


async def _measure(n: int, conns: int, upstream: str, calls: bool, state: str) -> dict[str, Any]:
    env = {
        "ACP_AUTH_TOKEN": TOKEN,
        "XWM_STATE_DIR": state,
        "XWM_AGENTS_DETECT": "false",
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
    }
    if upstream:
        env["XWM_PROVIDER_CODEX_URL"] = upstream
    cfg = load_config(config_file=None, env=env, flags={}).config
    lines = [0]

    def discard(data: bytes) -> None:
        lines[0] += data.count(b"\n")

    sink = setup_logging(cfg.log_level, cfg.secrets(), write=discard)
    bridge = Bridge(cfg)
    methods = BridgeMethods(bridge).table()
    server = Server(HttpTransport(bridge, Dispatcher(methods, bridge.metrics)))
    await server.setup()
    try:
        front = server.front
        assert front is not None
        conns_ = []
        for _ in range(conns):
            proto, transport = FrontProtocol(front), SinkTransport()
            proto.connection_made(transport)
            conns_.append((proto, transport))
        frames = bodies(conns, bool(upstream))
        loop = asyncio.get_running_loop()

        async def worker(i: int, count: int) -> None:
            proto, transport = conns_[i]
            for _ in range(count):
                transport.waiter = loop.create_future()
                proto.data_received(frames[i])
                answer = await transport.waiter
                if not answer.startswith(b"HTTP/1.1 200 ") or (
                    upstream and b'"success":true' not in answer
                ):
                    raise RuntimeError(f"unexpected answer: {answer[:300]!r}")

        await asyncio.gather(*(worker(i, max(5, 50 // conns)) for i in range(conns)))
        per = max(1, n // conns)
        profile = cProfile.Profile() if calls else None
        sink.flush()
        lines_before = lines[0]
        t0, p0 = time.thread_time(), time.process_time()
        if profile is not None:
            profile.enable()
        await asyncio.gather(*(worker(i, per) for i in range(conns)))
        if profile is not None:
            profile.disable()
        t1, p1 = time.thread_time(), time.process_time()
        total = per * conns
        result: dict[str, Any] = {
            "method": "session.message" if upstream else "acp.capabilities",
            "requests": total,
            "thread_us": round((t1 - t0) / total * 1e6, 2),
            "process_us": round((p1 - p0) / total * 1e6, 2),
        }
        sink.flush()
        result["log_lines"] = lines[0] - lines_before  # one audit line per request
        if profile is not None:
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            result["calls"] = round(sum(v[1] for v in stats.values()) / total, 1)
        for proto, transport in conns_:
            transport.closed = True
            proto.connection_lost(None)
    finally:
        await server.close()
        sink.close()
    return result


def _run_fast(run: Any) -> Any:
    """On uvloop when installed, as the daemon runs (cli/common.py)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run)
    return uvloop.run(run)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--conns", type=int, default=1, help="keep-alive connections (workers)")
    p.add_argument("--upstream", default="", help="a fake upstream's URL: session.message")
    p.add_argument("--calls", action="store_true", help="count Python calls (cProfile)")
    p.add_argument("--asyncio", action="store_true", help="asyncio's loop, not uvloop's")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = measure(args.requests, conns=args.conns, upstream=args.upstream, calls=args.calls)
    result = asyncio.run(run) if args.asyncio else _run_fast(run)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
